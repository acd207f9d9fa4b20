/**
 * The training stages: SFT on the conversations of data.sft, GRPO, RLOO and PPO on episodes of the
 * questions, RFT on the correct ones of the policy's own episodes. Each turns the config into its
 * trainer's options and calls runSft, runGrpo, runRloo, runPpo or runRft (lib/train/sft/sft.ts, grpo.ts,
 * rloo.ts, ppo.ts, rft.ts).
 */
import { basename, join } from 'node:path';
import type { ResolvedConfig } from '../config/types.js';
import type { Distributed } from '../distributed/run.js';
import type { LoraSpec } from '../engine/adapter.js';
import { OpenAIRollout } from '../engine/openai-rollout.js';
import { SlmError } from '../errors.js';
import type { Episode } from '../episodes/runner.js';
import { rewardFromConfig, trainerReward, type RewardDeps } from '../rewards/combine.js';
import type { ProgressTo } from '../util/progress.js';
import { dapoOptionsFrom } from './rl/dapo.js';
import { loadSftRows, type Question } from './data.js';
import { episodeRunner, type Agent, type Environment, type Log } from './environment.js';
import type { RolloutFn, TrainEpisode } from './types.js';
import { algorithmOf } from './rl/registry.js';
import { optimizerOptions, scheduleSpec } from './schedule.js';
import type { RunFolder } from './run.js';
import { runSft } from './sft/sft.js';
import { fitContext, tokenizeConversation } from './sft/sft-data.js';
import { withOldLogprobs } from './rl/old-logprobs.js';

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

function loraSpec(cfg: ResolvedConfig): LoraSpec {
  const l = cfg.lora;
  return {
    r: l.r,
    alpha: l.alpha,
    dropout: l.dropout,
    rslora: l.rslora,
    targets: l.targets,
    ...(l.layers ? { layers: l.layers } : {}),
  } as LoraSpec;
}

/** What every trainer takes: the adapter, the optimizer, the seed, checkpoints and resume, the rank's shard. */
export function trainerOptions(
  cfg: ResolvedConfig,
  opts: { resume?: boolean; stopAfter?: number; progress?: ProgressTo },
  dist: Distributed | null,
) {
  return {
    lora: loraSpec(cfg),
    ...optimizerOptions(cfg.optim),
    seed: cfg.train.seed,
    checkpointEvery: cfg.train.checkpoint_every,
    resume: opts.resume,
    stopAfter: opts.stopAfter,
    shard: dist?.shard,
    progress: opts.progress,
  };
}

/** A stage as the session sets it up: the config, the policy, the run folder and the per-step callback. */
export interface StageRun {
  cfg: ResolvedConfig;
  agent: Agent;
  run: RunFolder;
  dir: string;
  log: Log;
  common: ReturnType<typeof trainerOptions>;
  onStep: (row: Record<string, unknown>) => Promise<void>;
}

/** SFT on the conversations of data.sft (leaking rows left out, conversations cut to protocol.max_context). */
export async function sftStage(stageRun: StageRun): Promise<TrainResult> {
  const { cfg, agent, log } = stageRun;
  if (!cfg.data.sft)
    throw new SlmError('CONFIG_INVALID', 'stage: sft needs data.sft (chat-format JSONL {messages: [...]}).', { path: 'data.sft' });
  const { rows, dropped } = await loadSftRows(cfg.data.sft, cfg.data.exclude_leaking);
  if (dropped) log(`sft: dropped ${dropped} of ${rows.length + dropped} rows marked in_test_split (data.exclude_leaking)`);
  // protocol.enable_thinking: rendered as rollouts render (lib/train/environment.ts episodeRunner).
  const thinking = cfg.protocol.enable_thinking !== null ? { enableThinking: cfg.protocol.enable_thinking } : {};
  log(
    `sft: conversations rendered with the chat template from ${agent.formatter.template.origin}${cfg.model.chat_template === null ? ' (set model.chat_template to use another)' : ' (model.chat_template)'}`,
  );
  const examples = rows.map((r, i) => tokenizeConversation(r.messages, agent.formatter, agent.tokenizer, i, thinking));
  // Longer than the context: cut to what fits (loss on the assistant tokens within it), as the
  // reference's tokenizer truncation does, rather than dropped whole.
  const fit = fitContext(examples, cfg.protocol.max_context);
  if (fit.truncated || fit.dropped)
    log(
      `sft: ${fit.truncated} of ${examples.length} conversations longer than protocol.max_context (${cfg.protocol.max_context} tokens) truncated to it (loss on what fits)${fit.dropped ? `; ${fit.dropped} dropped (no assistant token within the limit)` : ''}`,
    );
  const r = await runSft(agent.model, fit.examples, stageRun.run, {
    ...stageRun.common,
    epochs: cfg.train.epochs,
    maxSteps: cfg.train.steps ?? undefined,
    batchSize: cfg.train.batch_size,
    schedule: scheduleSpec(cfg),
    onStep: stageRun.onStep,
  });
  return { stage: cfg.stage, dir: stageRun.dir, steps: r.steps, adapter: join(stageRun.dir, 'adapter'), lastLoss: r.lastLoss };
}

function trainEpisode(e: Episode): TrainEpisode {
  return {
    ids: e.ids,
    lossMask: e.lossMask,
    logprobs: e.logprobs,
    ...(e.forced ? { forced: e.forced } : {}),
    temperature: e.temperature,
    answer: e.answer,
    turns: e.turns,
    record: { ...e.record },
  };
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
    const runner = episodeRunner(cfg, agent, env, {
      seed: reqs[0].seed,
      onTurn: onProgress && ((t) => onProgress(t.finished, reqs.length)),
      generator: remote,
    });
    const r = await runner.run(
      reqs.map((q) => ({
        question: q.question.question,
        prompt: q.question.prompt,
        temperature: q.temperature,
        ...(q.topP !== undefined ? { topP: q.topP } : {}),
        seed: q.seed,
      })),
    );
    // algorithm.loss_temperature: the loss (and the recomputed old log-probs) score at it.
    const lt = cfg.algorithm.loss_temperature;
    const eps = r.episodes.map((e) => ({ ...trainEpisode(e), ...(lt !== null ? { lossTemperature: lt } : {}) }));
    // Remote servers' log-probs are not this engine's: recomputed here (at the loss temperature).
    if (remote) return withOldLogprobs(agent.model, eps, 'recompute');
    // algorithm.old_logprobs, for a loss that takes them (not RFT's SFT loss).
    return algorithmOf(cfg.stage)?.oldLogprobs === false ? eps : withOldLogprobs(agent.model, eps, cfg.algorithm.old_logprobs);
  };
}

/** rollout.engine openai: the servers that generate the rollouts (undefined for the native engine). */
function remoteRollout(stage: StageRun, dist: Distributed | null): OpenAIRollout | undefined {
  const { cfg, agent, dir } = stage;
  if (cfg.rollout.engine !== 'openai') return undefined;
  const o8 = cfg.rollout.openai;
  stage.log(`rollouts: OpenAI-compatible servers ${o8.urls.join(', ')} (adapter reloaded after every step; log-probs recomputed here)`);
  return new OpenAIRollout({
    urls: o8.urls,
    model: o8.model,
    timeoutS: o8.timeout_s,
    retries: o8.retries,
    concurrency: o8.concurrency,
    stopTokenIds: agent.tokenizer.stopTokenIds,
    adapterDir: o8.adapter_dir ?? join(dir, 'rollout-adapters'),
    name: `${basename(dir)}${dist ? `-rank${dist.shard.rank}` : ''}`,
  });
}

/** The trainers' reward: the config's parts, given the question's text, gold answers and id. */
function stageReward(cfg: ResolvedConfig, deps: RewardDeps) {
  return trainerReward(rewardFromConfig(cfg.reward, deps), (q: Question) => ({ question: q.question, golds: q.golds, id: q.id }));
}

/**
 * An RL stage (the config's stage is a registered algorithm) on the train questions: episodes in
 * `env`, scored by the config's reward, generated by the trainer's engine or (rollout.engine openai)
 * remote servers; the algorithm's definition turns the config into its options and trains.
 */
export async function rlStage(
  stageRun: StageRun,
  train: Question[],
  env: Environment,
  deps: RewardDeps,
  opts: { keepAdapter: boolean; dist: Distributed | null },
): Promise<TrainResult> {
  const { cfg, agent, dir } = stageRun;
  const algorithm = algorithmOf(cfg.stage);
  if (!algorithm)
    throw new SlmError(
      'CONFIG_INVALID',
      `stage ${JSON.stringify(cfg.stage)} is not an RL algorithm (registered: lib/train/rl/registry.ts).`,
      { path: 'stage' },
    );
  const perEpoch = Math.max(1, Math.floor(train.length / cfg.rollout.batch_questions));
  const steps = cfg.train.steps ?? cfg.train.epochs * perEpoch;
  const loop = {
    ...stageRun.common,
    questionsPerStep: cfg.rollout.batch_questions,
    steps,
    temperature: cfg.rollout.temperature,
    topP: cfg.rollout.top_p,
    keepAdapter: opts.keepAdapter,
    klReference: cfg.algorithm.kl_reference,
    onStep: stageRun.onStep,
    ...dapoOptionsFrom(cfg),
  };
  const rollout = rolloutFn(cfg, agent, env, remoteRollout(stageRun, opts.dist));
  const r = await algorithm.train({
    model: agent.model,
    questions: train,
    run: stageRun.run,
    deps: { rollout, reward: stageReward(cfg, deps) },
    loop,
    cfg,
    log: stageRun.log,
  });
  return {
    stage: cfg.stage,
    dir,
    steps: r.steps,
    adapter: join(dir, 'adapter'),
    meanReward: r.meanReward,
    ...(r.lastLoss !== undefined ? { lastLoss: r.lastLoss } : {}),
  };
}
