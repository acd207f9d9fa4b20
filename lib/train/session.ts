/**
 * From a resolved config to a running stage: the questions and their split, the model with its
 * tokenizer and chat template, the environment (search index, sandbox, protocol), the episode
 * runner, the reward, and the trainer (SFT, GRPO or PPO) — or the evaluation. The CLI's `train`
 * and `eval` commands are thin wrappers over `trainFromConfig` and `evalFromConfig`.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import type { ResolvedConfig } from '../config/types.js';
import { groupAdvantageOptions, ppoAdvantageOptions, scheduleSpec } from '../config/algorithm.js';
import { runDir, writeResolvedConfig } from '../config/load.js';
import type { LoraSpec } from '../engine/adapter.js';
import { Model } from '../engine/model.js';
import { setThreads } from '../engine/runtime.js';
import { SlmError, describe } from '../errors.js';
import { EpisodeRunner, type Episode, type EpisodeRunnerOptions, type RunnerTokenizer } from '../episodes/runner.js';
import { codeProtocol, tagsProtocol, type EpisodeProtocol, type TagsProtocolOptions } from '../episodes/protocol.js';
import { directProtocol } from '../episodes/direct.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import { ChatFormatter } from '../model/chat.js';
import { loadTokenizer } from '../model/tokenizer.js';
import type { HfTokenizer } from '../model/tokenizer.js';
import { Corpus, readRows } from '../retrieval/corpus.js';
import { localDataFiles, localModelDir } from '../hub/download.js';
import { isHubRef } from '../hub/ref.js';
import { HttpRetriever } from '../retrieval/http.js';
import { SearchIndex, embedderFor } from '../retrieval/index.js';
import type { SearchTools } from '../retrieval/types.js';
import { answerMetrics } from '../rewards/metrics.js';
import { goldAnswers, rewardFromConfig, trainerReward, type ComposedRewardFn, type RewardDeps } from '../rewards/combine.js';
import { parseJudgeConfig } from '../rewards/config.js';
import { createSandbox, type Sandbox } from '../sandbox/index.js';
import { PythonSandboxPool } from '../sandbox/python.js';
import { checkTools, loadRewardModule, loadToolsModule, type CustomRewardFn, type CustomTools } from '../extensions.js';
import { groupAdvantageFn } from './advantages.js';
import { runGrpo, type RolloutFn, type TrainEpisode } from './grpo.js';
import { runPpo } from './ppo.js';
import { RunFolder, permutation } from './run.js';
import { writeReport } from './report.js';
import { Progress, phasedProgress, type ProgressTo } from '../util/progress.js';
import { runSft } from './sft.js';
import { fitContext, readSftRows, sftPrompts, tokenizeConversation } from './sft-data.js';
import { RankRunFolder, joinFromConfig, makeDataParallel, type Distributed } from '../distributed/run.js';
import { OpenAIRollout, recomputeLogprobs } from '../engine/openai-rollout.js';
import type { TextGenerator } from '../engine/types.js';

export type Log = (line: string) => void;

// ---------------------------------------------------------------------------------------------
// Questions

export interface Question {
  id: string;
  /** Position in the file. */
  index: number;
  question: string;
  golds: string[];
  /** Search-R1's `data_source` (nq, hotpotqa, ...) when the row has one. */
  data_source?: string;
  /**
   * The row's own chat prompt (Search-R1's processed files: `prompt`, a list of {role, content}) when
   * it has one: tags episodes start from exactly these messages (protocol.use_data_prompt).
   */
  prompt?: ChatMessage[];
}

/**
 * The question of a Search-R1 processed row that kept only its `prompt` (the template ends with
 * "Question: …"), for logs and rewards; the episode itself starts from the prompt (Question.prompt).
 */
function questionFromPrompt(prompt: unknown): string | undefined {
  if (!Array.isArray(prompt)) return undefined;
  const user = [...prompt].reverse().find((m) => m && m.role === 'user' && typeof m.content === 'string');
  const m = user ? /Question:\s*([^\n]+)\s*$/.exec(user.content) : null;
  return m ? m[1].trim() : undefined;
}

/**
 * Question rows from JSONL, JSON or Parquet: `question` and `answer` (a string, a list, or
 * Search-R1's `golden_answers` / `reward_model.ground_truth.target` lists of acceptable answers),
 * optional `id` and `data_source`. A row's `prompt` in chat format (Search-R1's processed files: a
 * list of {role, content}) is kept as Question.prompt; a row without `question` gives the one at the
 * end of its `prompt`. A `prompt` of another type (a plain string) is not used.
 */
export async function loadQuestions(file: string): Promise<Question[]> {
  if (!isHubRef(file) && !existsSync(file)) throw new SlmError('FILE_NOT_FOUND', `questions file ${file} does not exist. Set data.questions to JSONL/JSON/Parquet rows {question, answer}.`);
  const rows = await readRows(file);
  if (!rows.length) throw new SlmError('DATA_INVALID', `${file} has no question rows.`);
  return rows.map((r, i) => {
    const o = (r ?? {}) as Record<string, unknown>;
    const question = typeof o.question === 'string' ? o.question : questionFromPrompt(o.prompt);
    if (typeof question !== 'string' || !question.trim())
      throw new SlmError(
        'DATA_INVALID',
        `${file}: row ${i + 1} needs a non-empty string "question", found ${describe(o.question)}. Question rows are {question, answer} (or Search-R1's {question, golden_answers}).${Array.isArray(o.messages) ? ' This row is a chat conversation ({messages}): SFT data, which belongs in data.sft of a stage: sft config.' : ''}`,
      );
    let prompt: ChatMessage[] | undefined;
    if (Array.isArray(o.prompt)) {
      const roles = ['system', 'user', 'assistant', 'tool'];
      const bad = o.prompt.findIndex((m) => !m || typeof m !== 'object' || !roles.includes(m.role) || typeof m.content !== 'string');
      if (bad >= 0 || !o.prompt.length)
        throw new SlmError('DATA_INVALID', `${file}: row ${i + 1}: "prompt" is a list, so it must be chat messages {role: ${roles.join(' | ')}, content: string} (Search-R1's layout), but ${o.prompt.length ? `item ${bad + 1} is ${describe(o.prompt[bad])}` : 'it is empty'}.`);
      prompt = o.prompt.map((m: { role: ChatMessage['role']; content: string }) => ({ role: m.role, content: m.content }));
    }
    const answer = o.answer ?? o.answers ?? o.golden_answers ?? o.reward_model;
    let golds: string[];
    try {
      golds = goldAnswers((answer as { ground_truth?: unknown })?.ground_truth ?? answer);
    } catch (e) {
      throw new SlmError('DATA_INVALID', `${file}: row ${i + 1}: ${(e as Error).message}`);
    }
    return { id: String(o.id ?? o.index ?? i), index: i, question, golds, ...(typeof o.data_source === 'string' ? { data_source: o.data_source } : {}), ...(prompt ? { prompt } : {}) };
  });
}

/** The split of the config: the first `train_fraction` by index (or after a seeded shuffle) train, the rest eval. */
export function splitQuestions<T>(rows: readonly T[], split: { train_fraction: number; seed: number | null }): { train: T[]; eval: T[] } {
  const order = split.seed === null ? rows.map((_, i) => i) : permutation(rows.length, split.seed, 0);
  const cut = Math.round(rows.length * split.train_fraction);
  return { train: order.slice(0, cut).map((i) => rows[i]), eval: order.slice(cut).map((i) => rows[i]) };
}

// ---------------------------------------------------------------------------------------------
// Model and environment

export interface Agent {
  model: Model;
  tokenizer: HfTokenizer;
  formatter: ChatFormatter;
}

export async function loadAgent(cfg: ResolvedConfig, adapter: string | null = cfg.model.adapter, log: Log = () => {}): Promise<Agent> {
  if (cfg.model.threads > 0) setThreads(cfg.model.threads);
  // hf:OWNER/NAME model and adapter references are downloaded (once) into the hub cache.
  const path = await localModelDir(cfg.model.path);
  const model = await Model.load(path, { dtype: cfg.model.dtype, device: cfg.model.device, adapter: adapter ? await localModelDir(adapter) : undefined });
  try {
    const tokenizer = loadTokenizer(path);
    if (tokenizer.vocabSize <= model.vocabSize) model.setVocab(tokenizer.tokenBytes());
    // Episode KV caches kept between turns (rollout.kv_cache_reuse): their memory bound.
    model.setCacheLimit(cfg.rollout.kv_cache_mb * 2 ** 20, { log });
    return { model, tokenizer, formatter: ChatFormatter.forModel(path) };
  } catch (e) {
    model.dispose();
    throw e;
  }
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
    log(`index: ${cfg.data.index} (${idx.corpus.pages.length} pages, ${idx.chunks.length} chunks, ${idx.params.kind}, ef ${cfg.retrieval.ef})`);
    return idx;
  }
  if (!cfg.data.corpus) throw new SlmError('CONFIG_INVALID', `data.index ${cfg.data.index} holds no index and data.corpus is not set; build one with \`slm-train index\` or set data.corpus.`, { path: 'data.index' });
  const t0 = performance.now();
  const kind = cfg.retrieval.kind;
  if (kind === 'http') throw new SlmError('CONFIG_INVALID', `retrieval.kind: http searches a remote server; building a local index from ${cfg.data.corpus} needs retrieval.kind dense, bm25 or hybrid.`, { path: 'retrieval.kind' });
  const embedder = await embedderFor(cfg.retrieval.embedder);
  const bars = phasedProgress('index', 'chunks', progress);
  let idx: SearchIndex;
  try {
    idx = await SearchIndex.build(await Corpus.load(cfg.data.corpus), { kind, ef: cfg.retrieval.ef, embedder, onProgress: bars.update });
  } finally {
    bars.stop();
  }
  log(`index: built from ${cfg.data.corpus} in ${((performance.now() - t0) / 1e3).toFixed(1)} s (${idx.corpus.pages.length} pages, ${idx.chunks.length} chunks, ${idx.params.kind})`);
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
export async function withSftPrompts(cfg: ResolvedConfig, log: Log = () => {}): Promise<ResolvedConfig> {
  if (!cfg.protocol.prompts_from_sft) return cfg;
  const file = required(cfg.data.sft, 'data.sft');
  let rows = (await localDataFiles(file)).flatMap((f) => readSftRows(f));
  if (cfg.data.exclude_leaking) rows = rows.filter((r) => r.in_test_split !== true);
  const p = sftPrompts(rows);
  if (p.system === null) throw new SlmError('DATA_INVALID', `protocol.prompts_from_sft: none of the ${p.rows} conversations of ${file} starts with a system message; set protocol.system_prompt instead.`);
  log(`prompts: the system prompt of ${file} (${p.systemRows} of ${p.rows} conversations)${p.finalTurn !== null ? `, its final-turn notice (${p.finalTurnRows})` : ''}`);
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
export async function openEnvironment(cfg: ResolvedConfig, log: Log = () => {}, progress?: ProgressTo, ext: Pick<Extensions, 'tools'> = {}): Promise<Environment> {
  cfg = await withSftPrompts(cfg, log);
  const kind = cfg.protocol.kind;
  if (kind === 'direct') return { protocol: directProtocol(), describe: 'protocol direct (no search)', close: async () => {} };
  const tags = (search: TagsProtocolOptions['search']) =>
    tagsProtocol({ search, topK: cfg.protocol.top_k, instruction: cfg.protocol.instruction, usePrompt: cfg.protocol.use_data_prompt, turnsCount: cfg.protocol.turns_count ?? 'searches', ...(cfg.protocol.system_prompt ? { systemPrompt: cfg.protocol.system_prompt } : {}) });
  // retrieval.kind http goes with the tags protocol and names its url (config cross-checks).
  if (cfg.retrieval.kind === 'http') {
    const remote = new HttpRetriever({ url: cfg.retrieval.url ?? '', timeoutS: cfg.retrieval.timeout_s, retries: cfg.retrieval.retries });
    return { protocol: tags(remote), describe: `protocol tags, top-k ${cfg.protocol.top_k}, retrieval server ${remote.url}`, close: async () => {} };
  }
  const sb = cfg.sandbox;
  // sandbox.tools_module: extra functions programs can call, run here like the search tools; loaded
  // before the index is built, so that a broken module fails at once.
  const extraTools = kind === 'tags' ? undefined : ext.tools ? checkTools(ext.tools, 'tools', 'tools') : sb.tools_module ? await loadToolsModule(sb.tools_module) : undefined;
  const index = await openIndex(cfg, log, progress);
  if (kind === 'tags') return { protocol: tags(index), index, describe: `protocol tags, top-k ${cfg.protocol.top_k}, ${index.params.kind} retrieval`, close: async () => {} };
  if (extraTools) log(`tools: ${Object.keys(extraTools).join(', ')} from ${ext.tools ? 'code' : sb.tools_module}`);
  // search_pages returns retrieval.k pages; the other tools are the index's.
  const tools: SearchTools = { search_pages: (q) => index.searchPages(q, cfg.retrieval.k), view_sections: (p) => index.view_sections(p), read_section: (s) => index.read_section(s) };
  const sandbox = await createSandbox(
    sb.kind === 'python'
      ? { kind: 'python', tools, ...(extraTools ? { extraTools } : {}), size: sb.workers, timeoutMs: sb.timeout_s * 1000, memoryMb: sb.memory_mb, requireIsolation: sb.require_isolation }
      : { kind: 'quickjs', tools, ...(extraTools ? { extraTools } : {}), timeoutMs: sb.timeout_s * 1000, memoryMb: sb.memory_mb },
  );
  let isolation = '';
  // the level the pool actually runs at (not a second detection)
  if (sandbox instanceof PythonSandboxPool) isolation = `, isolation ${sandbox.isolation.level}`;
  return {
    protocol: codeProtocol({ executor: sandbox, maxOutputChars: cfg.protocol.tool_output_chars, language: sb.kind === 'quickjs' ? 'javascript' : 'python', ...(cfg.protocol.system_prompt ? { systemPrompt: cfg.protocol.system_prompt } : {}), ...(cfg.protocol.final_turn_notice !== null ? { finalTurnNotice: cfg.protocol.final_turn_notice } : {}), searchResults: cfg.retrieval.k, ...(cfg.protocol.question_variable ? { questionVariable: cfg.protocol.question_variable } : {}), finalAnswer: cfg.protocol.final_answer }),
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
    encode: (text) => tok.encode(text),
    decode: (ids, opts) => tok.decode(Array.from(ids).filter((id) => id < n), opts),
    stopTokenIds: tok.stopTokenIds,
  };
}

export function episodeRunner(cfg: ResolvedConfig, agent: Agent, env: Environment, o: { eval?: boolean; seed: number; temperature?: number; onTurn?: EpisodeRunnerOptions['onTurn']; generator?: TextGenerator }): EpisodeRunner {
  const p = cfg.protocol;
  return new EpisodeRunner({
    generator: o.generator ?? agent.model,
    tokenizer: runnerTokenizer(agent.tokenizer),
    formatter: agent.formatter,
    protocol: env.protocol,
    maxTurns: o.eval ? (p.max_turns_eval ?? p.max_turns) : p.max_turns,
    maxNewTokens: p.max_new_tokens,
    maxTotalTokens: p.max_context,
    temperature: o.temperature,
    topP: o.eval ? (cfg.eval.top_p ?? midpoint(cfg.rollout.top_p)) : typeof cfg.rollout.top_p === 'number' ? cfg.rollout.top_p : undefined,
    topK: cfg.rollout.top_k || undefined,
    seed: o.seed,
    cacheReuse: cfg.rollout.kv_cache_reuse,
    onTurn: o.onTurn,
  });
}

/** A range's middle (evaluation without eval.top_p, where a training range draws per rollout). */
const midpoint = (v: number | [number, number]) => (typeof v === 'number' ? v : (v[0] + v[1]) / 2);

function trainEpisode(e: Episode, q: Question): TrainEpisode {
  return { ids: e.ids, lossMask: e.lossMask, logprobs: e.logprobs, temperature: e.temperature, answer: e.answer, turns: e.turns, record: { ...e.record } };
}

/**
 * The trainers' rollout function: one EpisodeRunner batch per call, seeded by the request. With
 * `remote` (rollout.engine openai) the servers generate with the adapter as it is now (written and
 * loaded before the batch) and the trainer's engine recomputes the log-probs.
 */
export function rolloutFn(cfg: ResolvedConfig, agent: Agent, env: Environment, remote?: OpenAIRollout): RolloutFn<Question> {
  return async (reqs, onProgress) => {
    if (!reqs.length) return [];
    if (remote) await remote.syncAdapter(agent.model);
    const runner = episodeRunner(cfg, agent, env, { seed: reqs[0].seed, onTurn: onProgress && ((t) => onProgress(t.finished, reqs.length)), generator: remote });
    const r = await runner.run(reqs.map((q) => ({ question: q.question.question, prompt: q.question.prompt, temperature: q.temperature, ...(q.topP !== undefined ? { topP: q.topP } : {}), seed: q.seed })));
    const eps = r.episodes.map((e, i) => trainEpisode(e, reqs[i].question));
    return remote ? recomputeLogprobs(agent.model, eps) : eps;
  };
}

export function loraSpec(cfg: ResolvedConfig): LoraSpec {
  const l = cfg.lora;
  return { r: l.r, alpha: l.alpha, dropout: l.dropout, rslora: l.rslora, targets: l.targets, ...(l.layers ? { layers: l.layers } : {}) } as LoraSpec;
}

/**
 * What the reward needs besides the config: with judge parts on the native engine
 * (`reward.judge.model_path`, no base_url), the judge model loaded beside the policy.
 */
export async function rewardDeps(cfg: ResolvedConfig, log: Log, ext: Pick<Extensions, 'reward'> = {}): Promise<{ deps: RewardDeps; close(): void }> {
  const onError = (component: string, message: string) => log(`reward: ${component} failed: ${message}`);
  // reward.module: the user's reward function, imported once (REWARD_MODULE_INVALID when it cannot be).
  const file = cfg.reward.module;
  const custom = ext.reward ? { customReward: { fn: ext.reward, file: '<reward function>' } } : file ? { customReward: { fn: await loadRewardModule(file), file } } : {};
  if (file && !ext.reward) log(`reward: module ${file}`);
  const usesJudge = (cfg.reward.parts as Array<{ kind?: unknown }>).some((p) => typeof p.kind === 'string' && p.kind.startsWith('judge'));
  const j = parseJudgeConfig(cfg.reward.judge ?? {});
  if (!usesJudge || j.backend !== 'engine' || !j.model_path) return { deps: { onError, ...custom }, close: () => {} };
  const judgeDir = await localModelDir(j.model_path);
  const model = await Model.load(judgeDir, { dtype: cfg.model.dtype, device: cfg.model.device });
  try {
    const tok = loadTokenizer(judgeDir);
    if (tok.vocabSize <= model.vocabSize) model.setVocab(tok.tokenBytes());
    log(`judge: ${j.model_path} on the native engine`);
    return { deps: { onError, ...custom, judgeEngine: { generator: model, tokenizer: runnerTokenizer(tok), formatter: ChatFormatter.forModel(judgeDir) } }, close: () => model.dispose() };
  } catch (e) {
    model.dispose();
    throw e;
  }
}

// ---------------------------------------------------------------------------------------------
// Train

export interface TrainResult {
  stage: string;
  dir: string;
  steps: number;
  /** The trained adapter (PEFT folder). */
  adapter: string;
  /** Mean reward per step (RL) or the last loss (SFT). */
  meanReward?: number[];
  lastLoss?: number;
}

export interface StageOptions {
  resume?: boolean;
  log?: Log;
  /** Overrides as given on the command line (recorded in the resolved config). */
  overrides?: readonly string[];
  configFile?: string;
  /** Stop after this many optimizer steps in this process (tests of resume). */
  stopAfter?: number;
  /** Progress bars of indexing, training steps and evaluations (the CLI: stderr); default none. */
  progress?: ProgressTo;
  /** A reward function (the part `module`) in place of reward.module's. */
  reward?: CustomRewardFn;
  /** Extra functions programs can call, in place of sandbox.tools_module's. */
  tools?: CustomTools;
}

/**
 * Runs the stage of the config; as one rank of a data-parallel job when WORLD_SIZE > 1 (set by
 * `slm-train train --nproc N` or torchrun; lib/distributed): rank 0 writes the run folder.
 */
export async function trainFromConfig(cfg: ResolvedConfig, o: StageOptions = {}): Promise<TrainResult> {
  const dist = await joinFromConfig(cfg, o.log ?? (() => {}));
  if (!dist) return trainStage(cfg, o, null);
  try {
    return await trainStage(dist.cfg, o, dist);
  } finally {
    await dist.group.close();
  }
}

async function trainStage(cfg: ResolvedConfig, o: StageOptions, dist: Distributed | null): Promise<TrainResult> {
  const log = o.log ?? (() => {});
  const lead = !dist || dist.shard.rank === 0;
  const stage = cfg.stage;
  if (stage === 'eval') throw new SlmError('CONFIG_INVALID', 'stage: eval has nothing to train; run `slm-train eval --config FILE` instead.', { path: 'stage' });
  const dir = runDir(cfg);
  if (!o.resume && lead && existsSync(join(dir, 'checkpoints')) && readdirSync(join(dir, 'checkpoints')).some((d) => /^step-\d+$/.test(d)))
    throw new SlmError('RUN_EXISTS', `${dir} already holds checkpoints of a run. Continue it with --resume, or choose another run.name (or delete the folder).`);
  const run = lead ? new RunFolder(dir) : new RankRunFolder(dir, dist!.shard.rank);
  run.log = log;
  if (lead) writeResolvedConfig(cfg, dir, { file: o.configFile, overrides: o.overrides });
  const agent = await loadAgent(cfg, cfg.model.adapter, log);
  if (dist) makeDataParallel(agent.model, dist);
  const keepAdapter = cfg.model.adapter !== null;
  const common = {
    lora: loraSpec(cfg),
    weightDecay: cfg.optim.weight_decay,
    maxGradNorm: cfg.optim.max_grad_norm,
    adam: { beta1: cfg.optim.betas[0], beta2: cfg.optim.betas[1], eps: cfg.optim.eps },
    microBatch: cfg.optim.micro_batch || undefined,
    gradientCheckpointing: cfg.optim.gradient_checkpointing,
    seed: cfg.train.seed,
    checkpointEvery: cfg.train.checkpoint_every,
    resume: o.resume,
    stopAfter: o.stopAfter,
    shard: dist?.shard,
    progress: o.progress,
  };
  let env: Environment | undefined;
  let judge: { deps: RewardDeps; close(): void } | undefined;
  // train.eval_every: evaluate the model as it trains (adapter in place) on the eval split.
  let evalEnv: Environment | undefined;
  let evalQs: Question[] | undefined;
  const onStep = async (row: Record<string, unknown>) => {
    if (!lead) return;
    log(stepLine(row));
    const every = cfg.train.eval_every;
    if (!every || typeof row.step !== 'number' || row.step % every !== 0 || row.kind === 'eval') return;
    if (!cfg.data.questions) return log('train.eval_every: data.questions is not set; no evaluation during training');
    evalQs ??= await evalQuestions(cfg);
    const e = env ?? (evalEnv ??= await openEnvironment(cfg, log, o.progress, o));
    judge ??= await rewardDeps(cfg, log, o);
    const label = `${cfg.run.name ?? stage}@step-${row.step}`;
    const s = await evaluate(cfg, agent, e, judge.deps, evalQs, { label, adapter: null, dir: join(dir, 'evals', `step-${row.step}`), log, progress: o.progress });
    run.logMetrics({ step: row.step, kind: 'eval', eval_accuracy: s.accuracy, eval_em: s.em, eval_f1: s.f1, eval_answered: s.answered, eval_avg_turns: s.avg_turns, eval_time_s: s.time_s });
    log(`eval at step ${row.step}: accuracy ${(100 * s.accuracy).toFixed(1)} %, F1 ${(100 * s.f1).toFixed(1)} %, answered ${(100 * s.answered).toFixed(1)} %`);
  };
  try {
    log(`run: ${dir} (stage ${stage}, model ${cfg.model.path}${cfg.model.adapter ? `, adapter ${cfg.model.adapter}` : ''})`);
    let result: TrainResult;
    if (stage === 'sft') {
      if (!cfg.data.sft) throw new SlmError('CONFIG_INVALID', 'stage: sft needs data.sft (chat-format JSONL {messages: [...]}).', { path: 'data.sft' });
      let rows = (await localDataFiles(cfg.data.sft)).flatMap((f) => readSftRows(f));
      const before = rows.length;
      if (cfg.data.exclude_leaking) rows = rows.filter((r) => r.in_test_split !== true);
      if (rows.length < before) log(`sft: dropped ${before - rows.length} of ${before} rows marked in_test_split (data.exclude_leaking)`);
      const examples = rows.map((r, i) => tokenizeConversation(r.messages, agent.formatter, agent.tokenizer, i));
      // Longer than the context: cut to what fits (loss on the assistant tokens within it), as the
      // reference's tokenizer truncation does, rather than dropped whole.
      const fit = fitContext(examples, cfg.protocol.max_context);
      if (fit.truncated || fit.dropped)
        log(`sft: ${fit.truncated} of ${examples.length} conversations longer than protocol.max_context (${cfg.protocol.max_context} tokens) truncated to it (loss on what fits)${fit.dropped ? `; ${fit.dropped} dropped (no assistant token within the limit)` : ''}`);
      const kept = fit.examples;
      const r = await runSft(agent.model, kept, run, { ...common, epochs: cfg.train.epochs, maxSteps: cfg.train.steps ?? undefined, batchSize: cfg.train.batch_size, schedule: scheduleSpec(cfg), onStep });
      result = { stage, dir, steps: r.steps, adapter: join(dir, 'adapter'), lastLoss: r.lastLoss };
    } else {
      const all = await loadQuestions(required(cfg.data.questions, 'data.questions'));
      const { train } = splitQuestions(all, cfg.data.split);
      if (!train.length) throw new SlmError('DATA_INVALID', `the train split of ${cfg.data.questions} is empty (train_fraction ${cfg.data.split.train_fraction} of ${all.length} rows).`);
      env = await openEnvironment(cfg, log, o.progress, o);
      log(`environment: ${env.describe}`);
      judge ??= await rewardDeps(cfg, log, o);
      const reward = trainerReward(rewardFromConfig(cfg.reward as never, judge.deps), (q: Question) => ({ question: q.question, golds: q.golds, id: q.id }));
      const perEpoch = Math.max(1, Math.floor(train.length / cfg.rollout.batch_questions));
      const steps = cfg.train.steps ?? cfg.train.epochs * perEpoch;
      const rl = { ...common, questionsPerStep: cfg.rollout.batch_questions, steps, temperature: cfg.rollout.temperature, topP: cfg.rollout.top_p, keepAdapter, klReference: cfg.algorithm.kl_reference, clipLow: cfg.algorithm.clip_low, clipHigh: cfg.algorithm.clip_high, entropyCoef: cfg.algorithm.entropy_coef, onStep };
      const o8 = cfg.rollout.openai;
      const remote =
        cfg.rollout.engine === 'openai'
          ? new OpenAIRollout({ urls: o8.urls, model: o8.model, timeoutS: o8.timeout_s, retries: o8.retries, concurrency: o8.concurrency, stopTokenIds: agent.tokenizer.stopTokenIds, adapterDir: o8.adapter_dir ?? join(dir, 'rollout-adapters'), name: `${basename(dir)}${dist ? `-rank${dist.shard.rank}` : ''}` })
          : undefined;
      if (remote) log(`rollouts: OpenAI-compatible servers ${o8.urls.join(', ')} (adapter reloaded after every step; log-probs recomputed here)`);
      const rollout = rolloutFn(cfg, agent, env, remote);
      let r: { steps: number; meanReward: number[] };
      if (stage === 'grpo') {
        const g = groupAdvantageOptions(cfg);
        const fn = groupAdvantageFn(g);
        const est = cfg.algorithm.kl_estimator;
        if (cfg.algorithm.kl_coef > 0 && est === 'k2') throw new SlmError('CONFIG_INVALID', 'algorithm.kl_estimator: GRPO puts the KL in the loss, which supports k1 and k3; found k2.', { path: 'algorithm.kl_estimator' });
        r = await runGrpo(agent.model, train, run, { rollout, reward, advantages: (rw, correct) => fn(rw, g.useCorrectness ? correct : undefined) }, {
          ...rl,
          k: cfg.rollout.k,
          innerEpochs: cfg.algorithm.inner_epochs,
          klCoef: cfg.algorithm.kl_coef,
          klEstimator: est === 'k2' ? 'k3' : est,
          lossNorm: cfg.algorithm.loss_norm,
          turnDiscount: cfg.algorithm.turn_discount,
          schedule: scheduleSpec(cfg),
        });
      } else {
        const a = ppoAdvantageOptions(cfg);
        r = await runPpo(agent.model, train, run, { rollout, reward }, {
          ...rl,
          n: cfg.rollout.k,
          ppoEpochs: cfg.algorithm.inner_epochs,
          miniBatch: cfg.algorithm.mini_batch || undefined,
          gamma: a.gamma,
          lam: a.lam,
          whiten: a.whiten,
          klCoef: cfg.algorithm.kl_coef,
          klIn: cfg.algorithm.kl_in,
          klEstimator: cfg.algorithm.kl_estimator,
          tokenLevel: cfg.algorithm.loss_norm === 'token',
          vfCoef: cfg.algorithm.vf_coef,
          valueClip: cfg.algorithm.value_clip,
          schedule: scheduleSpec(cfg),
          criticLr: cfg.optim.critic_lr,
        });
      }
      result = { stage, dir, steps: r.steps, adapter: join(dir, 'adapter'), meanReward: r.meanReward };
    }
    if (lead && (o.stopAfter === undefined || result.steps >= (run.latestCheckpoint()?.state.step ?? 0))) {
      await agent.model.saveAdapter(result.adapter);
      log(`adapter: ${result.adapter}`);
    }
    if (lead)
      try {
        log(`report: ${await writeReport(dir)}`);
      } catch (e) {
        log(`report: not written (${(e as Error).message}); run \`slm-train report ${dir}\` to try again`);
      }
    return result;
  } finally {
    run.close();
    await env?.close();
    await evalEnv?.close();
    judge?.close();
    agent.model.dispose();
  }
}

function required(v: string | null, key: string): string {
  if (!v) throw new SlmError('CONFIG_INVALID', `${key} is not set; this stage needs it.`, { path: key });
  return v;
}

function fmt(v: unknown): string {
  return typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v);
}

/** One progress line per step: the step and its headline metrics. */
export function stepLine(row: Record<string, unknown>): string {
  const keys = ['loss', 'reward_mean', 'reward', 'accuracy', 'kl', 'clip_frac', 'grad_norm', 'lr', 'mask_coverage', 'time_rollout_s', 'time_train_s'];
  return `step ${row.step}: ` + keys.filter((k) => row[k] !== undefined && row[k] !== null).map((k) => `${k} ${fmt(row[k])}`).join(', ');
}

// ---------------------------------------------------------------------------------------------
// Eval

export interface EvalSummary {
  label: string;
  model: string;
  adapter: string | null;
  split: string;
  questions: number;
  /** Judge correctness when a judge part is configured, else exact match. */
  accuracy: number;
  accuracy_by: 'judge' | 'em';
  em: number;
  subem: number;
  f1: number;
  rouge_l: number;
  reward: number;
  avg_turns: number;
  answered: number;
  /** Per Search-R1 `data_source` (when the questions name one): questions, EM, F1, ROUGE-L. */
  by_source?: Record<string, { questions: number; em: number; f1: number; rouge_l: number }>;
  max_turns: number;
  temperature: number;
  top_p: number;
  /** Passages per search (tags protocol) and the new-token limit per turn. */
  top_k: number;
  max_new_tokens: number;
  time_s: number;
  date: string;
}

export interface EvalOptions {
  adapter?: string | null;
  /** Name of this evaluation in the comparison table (default: base, or the adapter's run). */
  label?: string;
  log?: Log;
  /** Evaluation batch size in episodes (default: rollout.batch_questions x rollout.k, at least 8). */
  batch?: number;
  /** Progress bars of indexing and evaluation (the CLI: stderr); default none. */
  progress?: ProgressTo;
  /** A reward function (the part `module`) in place of reward.module's. */
  reward?: CustomRewardFn;
  /** Extra functions programs can call, in place of sandbox.tools_module's. */
  tools?: CustomTools;
}

export function evalLabel(adapter: string | null): string {
  if (!adapter) return 'base';
  const a = resolve(adapter);
  // runs/NAME/adapter or runs/NAME/checkpoints/step-N/adapter -> NAME or NAME@step-N
  if (basename(a) === 'adapter') {
    const parent = dirname(a);
    if (/^step-\d+$/.test(basename(parent)) && basename(dirname(parent)) === 'checkpoints') return `${basename(dirname(dirname(parent)))}@${basename(parent)}`;
    return basename(parent);
  }
  return basename(a);
}

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/** The questions of the configured eval split (eval.split, eval.max_questions). */
export async function evalQuestions(cfg: ResolvedConfig): Promise<Question[]> {
  if (!cfg.data.questions)
    throw new SlmError(
      'CONFIG_INVALID',
      `data.questions is not set: evaluation needs question rows {question, answer}${cfg.stage === 'sft' ? `; this config is for stage sft (it trains on the conversations of data.sft)` : ''}. Set data.questions (and data.corpus or data.index for a searching protocol), e.g. data.questions=path/to/questions.jsonl.`,
      { path: 'data.questions' },
    );
  const all = await loadQuestions(cfg.data.questions);
  const parts = splitQuestions(all, cfg.data.split);
  let qs = cfg.eval.split === 'all' ? all : parts[cfg.eval.split];
  if (cfg.eval.max_questions !== null) qs = qs.slice(0, cfg.eval.max_questions);
  if (!qs.length) throw new SlmError('DATA_INVALID', `the ${cfg.eval.split} split of ${cfg.data.questions} is empty; nothing to evaluate.`);
  return qs;
}

/** EM / F1 / ROUGE-L per data_source (Search-R1's datasets), when the questions name one. */
function bySource(rows: ReadonlyArray<Record<string, unknown>>): Pick<EvalSummary, 'by_source'> {
  const groups = new Map<string, Array<Record<string, unknown>>>();
  for (const r of rows) {
    if (typeof r.data_source !== 'string') continue;
    const g = groups.get(r.data_source);
    if (g) g.push(r);
    else groups.set(r.data_source, [r]);
  }
  if (!groups.size) return {};
  const avg = (g: Array<Record<string, unknown>>, k: string) => mean(g.map((x) => x[k] as number));
  return { by_source: Object.fromEntries([...groups].map(([k, g]) => [k, { questions: g.length, em: avg(g, 'em'), f1: avg(g, 'f1'), rouge_l: avg(g, 'rouge_l') }])) };
}

/**
 * Evaluates the agent as it is (its adapter included) on `qs`: greedy or at eval.temperature, with
 * max_turns_eval; writes trajectories.jsonl and summary.json into `dir`.
 */
export async function evaluate(
  cfg: ResolvedConfig,
  agent: Agent,
  env: Environment,
  deps: RewardDeps,
  qs: readonly Question[],
  o: { label: string; adapter: string | null; dir: string; log: Log; batch?: number; progress?: ProgressTo },
): Promise<EvalSummary> {
  const t0 = performance.now();
  mkdirSync(o.dir, { recursive: true });
  o.log(`eval ${o.label}: ${qs.length} questions (${cfg.eval.split} split), ${env.describe}`);
  const rewardFn: ComposedRewardFn = rewardFromConfig(cfg.reward as never, deps);
  const byJudge = (cfg.reward.parts as Array<{ kind?: string }>).some((p) => p.kind === 'judge' || p.kind === 'judge_correctness');
  const batch = o.batch ?? Math.max(8, cfg.rollout.batch_questions * cfg.rollout.k);
  const rows: Array<Record<string, unknown>> = [];
  const lines: string[] = [];
  const bar = new Progress(`eval ${o.label}`, qs.length, 'questions', o.progress);
  try {
    for (let s = 0; s < qs.length; s += batch) {
      const chunk = qs.slice(s, s + batch);
      const runner = episodeRunner(cfg, agent, env, { eval: true, seed: cfg.train.seed * 7919 + s, temperature: cfg.eval.temperature, onTurn: (t) => bar.update(s + t.finished) });
      const r = await runner.run(chunk.map((q) => ({ question: q.question, prompt: q.prompt, temperature: cfg.eval.temperature })));
      // Every episode of the chunk scored at once (a judge endpoint limits its own concurrency).
      const rewards = await Promise.all(r.episodes.map((e, i) => rewardFn({ answer: e.answer, golds: chunk[i].golds, question: chunk[i].question, id: chunk[i].id, episode: { turns: e.turns, messages: e.messages, calls: e.calls, finish: e.finish } })));
      for (let i = 0; i < chunk.length; i++) {
        const e = r.episodes[i];
        const q = chunk[i];
        const m = answerMetrics(e.answer, q.golds);
        const rw = rewards[i];
        const correct = byJudge ? (rw.correct ?? false) : m.em === 1;
        const row = { id: q.id, ...(q.data_source ? { data_source: q.data_source } : {}), question: q.question, golds: q.golds, answer: e.answer, correct, ...m, reward: rw.total, parts: rw.parts, ...(Object.keys(rw.errors).length ? { reward_errors: rw.errors } : {}), turns: e.turns, finish: e.finish, calls: e.calls, messages: e.messages };
        rows.push(row);
        lines.push(JSON.stringify(row));
      }
      const accuracy = mean(rows.map((x) => (x.correct ? 1 : 0)));
      bar.update(s + chunk.length, { accuracy, reward: mean(rows.map((x) => x.reward as number)) });
      if (!o.progress) o.log(`eval ${o.label}: ${Math.min(s + batch, qs.length)}/${qs.length}, accuracy so far ${accuracy.toFixed(3)}`);
    }
  } finally {
    bar.stop();
  }
  writeFileSync(join(o.dir, 'trajectories.jsonl'), lines.join('\n') + '\n');
  const num = (k: string) => mean(rows.map((x) => x[k] as number));
  const summary: EvalSummary = {
    label: o.label,
    model: cfg.model.path,
    adapter: o.adapter,
    split: cfg.eval.split,
    questions: rows.length,
    accuracy: mean(rows.map((x) => (x.correct ? 1 : 0))),
    accuracy_by: byJudge ? 'judge' : 'em',
    em: num('em'),
    subem: num('subem'),
    f1: num('f1'),
    rouge_l: num('rouge_l'),
    reward: num('reward'),
    avg_turns: num('turns'),
    answered: mean(rows.map((x) => (x.answer !== null ? 1 : 0))),
    ...bySource(rows),
    max_turns: cfg.protocol.max_turns_eval ?? cfg.protocol.max_turns,
    temperature: cfg.eval.temperature,
    top_p: cfg.eval.top_p ?? midpoint(cfg.rollout.top_p),
    top_k: cfg.protocol.top_k,
    max_new_tokens: cfg.protocol.max_new_tokens,
    time_s: (performance.now() - t0) / 1e3,
    date: new Date().toISOString(),
  };
  writeFileSync(join(o.dir, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');
  return summary;
}

export async function evalFromConfig(cfg: ResolvedConfig, o: EvalOptions = {}): Promise<{ summary: EvalSummary; dir: string; table: string }> {
  const log = o.log ?? (() => {});
  const adapter = o.adapter === undefined ? cfg.model.adapter : o.adapter;
  const label = o.label ?? evalLabel(adapter);
  if (!/^[\w.@+-]+$/.test(label)) throw new SlmError('ARGUMENT_INVALID', `evaluation label ${JSON.stringify(label)}: expected letters, digits, ".", "_", "-", "+" or "@" (it names a folder).`);
  const qs = await evalQuestions(cfg);
  const dir = join(cfg.run.dir, 'evals', label);
  const agent = await loadAgent(cfg, adapter, log);
  let env: Environment | undefined;
  let judge: { deps: RewardDeps; close(): void } | undefined;
  try {
    env = await openEnvironment(cfg, log, o.progress, o);
    judge = await rewardDeps(cfg, log, o);
    const summary = await evaluate(cfg, agent, env, judge.deps, qs, { label, adapter, dir, log, batch: o.batch, progress: o.progress });
    const table = comparisonTable(join(cfg.run.dir, 'evals'), cfg.eval.table);
    writeFileSync(join(cfg.run.dir, 'evals', 'comparison.md'), table + '\n');
    return { summary, dir, table };
  } finally {
    await env?.close();
    judge?.close();
    agent.model.dispose();
  }
}

/** A markdown table of every evaluation under `evalsDir` (one row per label, in order of date). */
export function comparisonTable(evalsDir: string, shape: ResolvedConfig['eval']['table'] = 'full'): string {
  const rows: EvalSummary[] = [];
  for (const d of existsSync(evalsDir) ? readdirSync(evalsDir) : []) {
    const f = join(evalsDir, d, 'summary.json');
    if (!existsSync(f)) continue;
    try {
      rows.push(JSON.parse(readFileSync(f, 'utf8')));
    } catch {
      /* a damaged summary is left out */
    }
  }
  rows.sort((a, b) => a.date.localeCompare(b.date));
  if (shape === 'em_rouge_l') {
    // The SFT+PPO report's shape: one row per configuration, EM and ROUGE-L as fractions.
    return ['| configuration | EM | ROUGE-L |', '|---|---:|---:|', ...rows.map((r) => `| ${r.label} | ${r.em.toFixed(3)} | ${r.rouge_l.toFixed(3)} |`)].join('\n');
  }
  const pct = (x: number) => `${(100 * x).toFixed(1)}`;
  const head = '| run | split | n | accuracy % | by | EM % | F1 % | ROUGE-L % | answered % | avg turns | reward |';
  const sep = '|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|';
  const body = rows.map((r) => `| ${r.label} | ${r.split} | ${r.questions} | ${pct(r.accuracy)} | ${r.accuracy_by} | ${pct(r.em)} | ${pct(r.f1)} | ${pct(r.rouge_l)} | ${pct(r.answered)} | ${r.avg_turns.toFixed(2)} | ${r.reward.toFixed(3)} |`);
  return [head, sep, ...body].join('\n');
}
