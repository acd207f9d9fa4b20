/**
 * Where episodes run: the policy (model, tokenizer, chat template), the environment of the config
 * (search index or retrieval server, sandbox, protocol), the episode runner over both, and what the
 * reward needs besides the config (a reward module, a judge model on the native engine).
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { ResolvedConfig } from '../config/types.js';
import type { Model } from '../engine/model.js';
import { loadPolicy } from '../engine/policy.js';
import type { TextGenerator } from '../engine/types.js';
import { SlmError } from '../errors.js';
import { EpisodeRunner, type EpisodeRunnerOptions, type RunnerTokenizer } from '../episodes/runner.js';
import { codeProtocol, tagsProtocol, type EpisodeProtocol, type TagsProtocolOptions } from '../episodes/protocol.js';
import { directProtocol } from '../episodes/direct.js';
import { fillInstruction } from '../episodes/prompts.js';
import { checkTools, loadRewardModule, loadToolsModule, type CustomRewardFn, type CustomTools } from '../extensions.js';
import type { ChatFormatter } from '../model/chat.js';
import type { HfTokenizer } from '../model/tokenizer.js';
import { Corpus } from '../retrieval/corpus.js';
import { HttpRetriever } from '../retrieval/http.js';
import { SearchIndex, checkIndexFolder, embedderFor } from '../retrieval/index.js';
import type { SearchTools } from '../retrieval/types.js';
import type { RewardDeps } from '../rewards/combine.js';
import { parseJudgeConfig } from '../rewards/config.js';
import { createSandbox, type Sandbox } from '../sandbox/index.js';
import { PythonSandboxPool } from '../sandbox/python.js';
import { phasedProgress, type ProgressTo } from '../util/progress.js';
import { loadSftRows } from './data.js';
import { sftPrompts } from './sft/sft-data.js';

export type Log = (line: string) => void;

export interface Agent {
  model: Model;
  tokenizer: HfTokenizer;
  formatter: ChatFormatter;
}

/** The config's policy (model.path with `adapter`, default model.adapter) through loadPolicy. */
export async function loadAgent(cfg: ResolvedConfig, adapter: string | null = cfg.model.adapter, log: Log = () => {}): Promise<Agent> {
  const { model, tokenizer, formatter } = await loadPolicy(cfg.model.path, {
    dtype: cfg.model.dtype,
    device: cfg.model.device,
    adapter,
    threads: cfg.model.threads > 0 ? cfg.model.threads : undefined,
    chatTemplate: cfg.model.chat_template,
  });
  // Episode KV caches kept between turns (rollout.kv_cache_reuse): their memory bound.
  model.setCacheLimit(cfg.rollout.kv_cache_mb * 2 ** 20, { log });
  return { model, tokenizer, formatter };
}

export interface Environment {
  protocol: EpisodeProtocol;
  index?: SearchIndex;
  sandbox?: Sandbox;
  /** One line for the run log: protocol, retrieval, sandbox and its isolation level. */
  describe: string;
  close(): Promise<void>;
}

/** The search index of the config: data.index when it holds one, else built from data.corpus (and saved to data.index when set). */
export async function openIndex(cfg: ResolvedConfig, log: Log = () => {}, progress?: ProgressTo): Promise<SearchIndex> {
  if (cfg.data.index && existsSync(join(cfg.data.index, 'manifest.json'))) {
    const idx = await SearchIndex.load(cfg.data.index);
    // ef is a search-time setting: the config's, whatever the index was saved with.
    idx.setEf(cfg.retrieval.ef);
    log(
      `index: ${cfg.data.index} (${idx.corpus.pages.length} pages, ${idx.chunks.length} ${idx.params.text === 'titles' ? 'titles' : 'chunks'}, ${idx.params.kind}, ${idx.embedder.name}, ef ${cfg.retrieval.ef})`,
    );
    return idx;
  }
  if (!cfg.data.corpus)
    throw new SlmError(
      'CONFIG_INVALID',
      `data.index ${cfg.data.index} holds no index and data.corpus is not set; build one with \`slm-train index\` or set data.corpus.`,
      { path: 'data.index' },
    );
  if (cfg.data.index) checkIndexFolder(cfg.data.index); // before building: the index is saved there
  const t0 = performance.now();
  const kind = cfg.retrieval.kind;
  if (kind === 'http')
    throw new SlmError(
      'CONFIG_INVALID',
      `retrieval.kind: http searches a remote server; building a local index from ${cfg.data.corpus} needs retrieval.kind dense, bm25 or hybrid.`,
      { path: 'retrieval.kind' },
    );
  const embedder = await embedderFor(cfg.retrieval.embedder);
  const bars = phasedProgress('index', 'chunks', progress);
  let idx: SearchIndex;
  try {
    idx = await SearchIndex.build(await Corpus.load(cfg.data.corpus), {
      kind,
      text: cfg.retrieval.text,
      ef: cfg.retrieval.ef,
      embedder,
      onProgress: bars.update,
    });
  } finally {
    bars.stop();
  }
  log(
    `index: built from ${cfg.data.corpus} in ${((performance.now() - t0) / 1e3).toFixed(1)} s (${idx.corpus.pages.length} pages, ${idx.chunks.length} ${idx.params.text === 'titles' ? 'titles' : 'chunks'}, ${idx.params.kind}, ${idx.embedder.name})`,
  );
  if (cfg.data.index) {
    idx.save(cfg.data.index);
    log(`index: saved to ${cfg.data.index}`);
  }
  return idx;
}

/**
 * protocol.prompts_from_sft: the config with protocol.system_prompt and final_turn_notice taken from
 * the conversations of data.sft that SFT trains on (leaking rows left out as SFT leaves them out):
 * the most common of each, logged with how many rows carry it. Otherwise the config as it is.
 */
async function withSftPrompts(cfg: ResolvedConfig, log: Log = () => {}): Promise<ResolvedConfig> {
  if (!cfg.protocol.prompts_from_sft) return cfg;
  const file = required(cfg.data.sft, 'data.sft');
  const { rows } = await loadSftRows(file, cfg.data.exclude_leaking);
  const p = sftPrompts(rows);
  if (p.system === null)
    throw new SlmError(
      'DATA_INVALID',
      `protocol.prompts_from_sft: none of the ${p.rows} conversations of ${file} starts with a system message; set protocol.system_prompt instead.`,
    );
  log(
    `prompts: the system prompt of ${file} (${p.systemRows} of ${p.rows} conversations)${p.finalTurn !== null ? `, its final-turn notice (${p.finalTurnRows})` : ''}`,
  );
  return { ...cfg, protocol: { ...cfg.protocol, prompts_from_sft: false, system_prompt: p.system, final_turn_notice: p.finalTurn } };
}

/** What code adds to a config's environment and reward (the library; the CLI uses the config's modules). */
export interface Extensions {
  /**
   * A reward function: the reward part `module` (weight 1, added to reward.parts unless they list a
   * {kind: module} part), in place of reward.module's.
   */
  reward?: CustomRewardFn;
  /** Extra functions programs can call (code protocol), in place of sandbox.tools_module's. */
  tools?: CustomTools;
}

/**
 * The episode environment of the config: the protocol with its search index (tags, code) and
 * sandbox (code); `ext.tools` (or sandbox.tools_module) adds functions programs can call.
 */
export async function openEnvironment(
  cfg: ResolvedConfig,
  log: Log = () => {},
  progress?: ProgressTo,
  ext: Pick<Extensions, 'tools'> = {},
): Promise<Environment> {
  cfg = await withSftPrompts(cfg, log);
  const kind = cfg.protocol.kind;
  if (kind === 'direct')
    return {
      protocol: directProtocol(
        cfg.protocol.direct_instruction !== null
          ? { instruction: (q) => fillInstruction(cfg.protocol.direct_instruction as string, q) }
          : {},
      ),
      describe: 'protocol direct (no search)',
      close: async () => {},
    };
  const tags = (search: TagsProtocolOptions['search']) =>
    tagsProtocol({
      search,
      topK: cfg.protocol.top_k,
      instruction: cfg.protocol.instruction,
      usePrompt: cfg.protocol.use_data_prompt,
      ...(cfg.protocol.turns_count !== null ? { turnsCount: cfg.protocol.turns_count } : {}),
      ...(cfg.protocol.system_prompt ? { systemPrompt: cfg.protocol.system_prompt } : {}),
    });
  // retrieval.kind http goes with the tags protocol and names its url (config cross-checks).
  if (cfg.retrieval.kind === 'http') {
    const remote = new HttpRetriever({ url: cfg.retrieval.url ?? '', timeoutS: cfg.retrieval.timeout_s, retries: cfg.retrieval.retries });
    return {
      protocol: tags(remote),
      describe: `protocol tags, top-k ${cfg.protocol.top_k}, retrieval server ${remote.url}`,
      close: async () => {},
    };
  }
  const sb = cfg.sandbox;
  // sandbox.tools_module: extra functions programs can call, run here like the search tools; loaded
  // before the index is built, so that a broken module fails at once.
  const extraTools =
    kind === 'tags'
      ? undefined
      : ext.tools
        ? checkTools(ext.tools, 'tools', 'tools')
        : sb.tools_module
          ? await loadToolsModule(sb.tools_module)
          : undefined;
  const index = await openIndex(cfg, log, progress);
  if (kind === 'tags')
    return {
      protocol: tags(index),
      index,
      describe: `protocol tags, top-k ${cfg.protocol.top_k}, ${index.params.kind} retrieval`,
      close: async () => {},
    };
  if (extraTools) log(`tools: ${Object.keys(extraTools).join(', ')} from ${ext.tools ? 'code' : sb.tools_module}`);
  // search_pages returns retrieval.k pages; the other tools are the index's.
  const tools: SearchTools = {
    search_pages: (q) => index.searchPages(q, cfg.retrieval.k),
    view_sections: (p) => index.view_sections(p),
    read_section: (s) => index.read_section(s),
  };
  const sandbox = await createSandbox(
    sb.kind === 'python'
      ? {
          kind: 'python',
          tools,
          ...(extraTools ? { extraTools } : {}),
          size: sb.workers,
          timeoutMs: sb.timeout_s * 1000,
          memoryMb: sb.memory_mb,
          requireIsolation: sb.require_isolation,
        }
      : { kind: 'quickjs', tools, ...(extraTools ? { extraTools } : {}), timeoutMs: sb.timeout_s * 1000, memoryMb: sb.memory_mb },
  );
  let isolation = '';
  // the level the pool actually runs at (not a second detection)
  if (sandbox instanceof PythonSandboxPool) isolation = `, isolation ${sandbox.isolation.level}`;
  return {
    protocol: codeProtocol({
      executor: sandbox,
      maxOutputChars: cfg.protocol.tool_output_chars,
      language: sb.kind === 'quickjs' ? 'javascript' : 'python',
      ...(cfg.protocol.system_prompt ? { systemPrompt: cfg.protocol.system_prompt } : {}),
      ...(cfg.protocol.final_turn_notice !== null ? { finalTurnNotice: cfg.protocol.final_turn_notice } : {}),
      searchResults: cfg.retrieval.k,
      ...(cfg.protocol.question_variable ? { questionVariable: cfg.protocol.question_variable } : {}),
      finalAnswer: cfg.protocol.final_answer,
    }),
    index,
    sandbox,
    describe: `protocol code, ${sb.kind} sandbox (${sb.kind === 'python' ? `${sb.workers} workers, ` : ''}${sb.timeout_s} s, ${sb.memory_mb} MB${isolation}), ${index.params.kind} retrieval`,
    close: () => sandbox.close(),
  };
}

/**
 * The tokenizer as the episode runner sees it. Qwen3 checkpoints have more embedding rows (151,936)
 * than tokens (151,669); a sampled id past the tokenizer decodes to nothing, as in Hugging Face and
 * vLLM, instead of stopping the run (its log-prob stays in the sequence, so training stays exact).
 */
export function runnerTokenizer(tok: HfTokenizer): RunnerTokenizer {
  const n = tok.vocabSize;
  return {
    encode: (text, opts) => tok.encode(text, opts),
    decode: (ids, opts) =>
      tok.decode(
        Array.from(ids).filter((id) => id < n),
        opts,
      ),
    stopTokenIds: tok.stopTokenIds,
    specialTokens: tok.specialTokens,
  };
}

export function episodeRunner(
  cfg: ResolvedConfig,
  agent: Agent,
  env: Environment,
  opts: { eval?: boolean; seed: number; temperature?: number; onTurn?: EpisodeRunnerOptions['onTurn']; generator?: TextGenerator },
): EpisodeRunner {
  const p = cfg.protocol;
  return new EpisodeRunner({
    generator: opts.generator ?? agent.model,
    tokenizer: runnerTokenizer(agent.tokenizer),
    formatter: agent.formatter,
    protocol: env.protocol,
    maxTurns: opts.eval ? p.max_turns_eval : p.max_turns,
    maxNewTokens: opts.eval ? (cfg.eval.max_new_tokens ?? p.max_new_tokens) : p.max_new_tokens,
    maxTotalTokens: p.max_context,
    temperature: opts.temperature,
    topP: opts.eval
      ? (cfg.eval.top_p ?? midpoint(cfg.rollout.top_p))
      : typeof cfg.rollout.top_p === 'number'
        ? cfg.rollout.top_p
        : undefined,
    topK: cfg.rollout.top_k || undefined,
    seed: opts.seed,
    cacheReuse: cfg.rollout.kv_cache_reuse,
    onTurn: opts.onTurn,
    // Rollouts and evaluation alike (SFT renders with the same: stages.ts sftStage).
    ...(p.enable_thinking !== null ? { enableThinking: p.enable_thinking } : {}),
    ...(p.max_observation_tokens !== null ? { maxObservationTokens: p.max_observation_tokens } : {}),
    ...(opts.eval ? {} : trainingTurns(cfg)),
  });
}

/**
 * What training rollouts add to the runner (evaluation has none of it, as the reference code-search
 * system's evaluation): protocol.prefill_* and rollout.first_turn_*.
 */
export function trainingTurns(cfg: ResolvedConfig): Pick<EpisodeRunnerOptions, 'prefill' | 'firstTurn'> {
  const p = cfg.protocol;
  const r = cfg.rollout;
  return {
    ...(p.prefill_first !== null || p.prefill_final !== null
      ? {
          prefill: {
            ...(p.prefill_first !== null ? { first: p.prefill_first } : {}),
            ...(p.prefill_final !== null ? { final: p.prefill_final } : {}),
            trained: p.prefill_trained,
          },
        }
      : {}),
    ...(r.first_turn_temperature !== null ? { firstTurn: { temperature: r.first_turn_temperature, topP: r.first_turn_top_p ?? 1 } } : {}),
  };
}

/** A range's middle (evaluation without eval.top_p, where a training range draws per rollout). */
export const midpoint = (v: number | [number, number]) => (typeof v === 'number' ? v : (v[0] + v[1]) / 2);

/**
 * What the reward needs besides the config: with judge parts on the native engine
 * (`reward.judge.model_path`, no base_url), the judge model loaded beside the policy.
 */
export async function rewardDeps(
  cfg: ResolvedConfig,
  log: Log,
  ext: Pick<Extensions, 'reward'> = {},
): Promise<{ deps: RewardDeps; close(): void }> {
  const onError = (component: string, message: string) => log(`reward: ${component} failed: ${message}`);
  // reward.module: the user's reward function, imported once (REWARD_MODULE_INVALID when it cannot be).
  const file = cfg.reward.module;
  const custom = ext.reward
    ? { customReward: { fn: ext.reward, file: '<reward function>' } }
    : file
      ? { customReward: { fn: await loadRewardModule(file), file } }
      : {};
  if (file && !ext.reward) log(`reward: module ${file}`);
  const usesJudge = (cfg.reward.parts as Array<{ kind?: unknown }>).some((p) => typeof p.kind === 'string' && p.kind.startsWith('judge'));
  const j = parseJudgeConfig(cfg.reward.judge);
  if (!usesJudge || j.backend !== 'engine' || !j.model_path) return { deps: { onError, ...custom }, close: () => {} };
  const judge = await loadPolicy(j.model_path, { dtype: cfg.model.dtype, device: cfg.model.device });
  log(`judge: ${j.model_path} on the native engine`);
  return {
    deps: {
      onError,
      ...custom,
      judgeEngine: { generator: judge.model, tokenizer: runnerTokenizer(judge.tokenizer), formatter: judge.formatter },
    },
    close: () => judge.model.dispose(),
  };
}

/** A config key a stage needs: its value, or CONFIG_INVALID naming it. */
export function required(v: string | null, key: string): string {
  if (!v) throw new SlmError('CONFIG_INVALID', `${key} is not set; this stage needs it.`, { path: key });
  return v;
}
