/**
 * The one RL loop. Every step, whatever the algorithm:
 *   1. rollouts: the next questions (seeded order, resumable; this rank's share of them), `groupSize`
 *      rollouts each, temperature and top-p drawn per rollout, seeds from the question's index in the
 *      whole step — timed as time_rollout_s;
 *   2. score: every episode's reward (each part kept for the logs) — time_reward_s; with
 *      algorithm.overlong, DAPO's soft over-length penalty added and truncated episodes excluded;
 *      with rollout.dynamic_sampling, groups without a spread of rewards dropped and steps 1-2
 *      repeated on the next questions, a bounded number of times (lib/train/rl/dapo.ts, drawStep);
 *   3. advantages: the algorithm's (group-relative, leave-one-out, GAE with a critic...) — timed
 *      under the algorithm's `prepare.timer` when it names one (PPO: time_prepare_s, its forward
 *      passes);
 *   4. update: the algorithm's optimizer steps — time_train_s;
 *   5. log and checkpoint: one metrics row (rollout metrics over every rank, then the algorithm's),
 *      the trajectories JSONL, the data position advanced, a checkpoint every `checkpointEvery`.
 * An algorithm is an `RlAlgorithm` (lib/train/rl/grpo.ts, ppo.ts, rloo.ts) created by its definition
 * (lib/train/rl/algorithm.ts) in the registry (registry.ts): adding one means one file.
 */
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Model } from '../../engine/model.js';
import type { LoraSpec } from '../../engine/adapter.js';
import { SlmError } from '../../errors.js';
import { Progress, type ProgressTo } from '../../util/progress.js';
import { hashUniform } from '../../util/hash.js';
import { sectionDefaults } from '../../config/schema.js';
import { learningRate, type ScheduleSpec } from '../schedule.js';
import { permutation, type RunFolder, type TrainState } from '../run.js';
import { mean, rolloutMetrics, trajectoryLine } from './rollout-metrics.js';
import { shardRange } from '../../distributed/data-parallel.js';
import { gatherRollouts } from '../../distributed/gather.js';
import type { Shard } from '../../distributed/run.js';
import type { RewardResult, RlDeps, RolloutRequest, TrainEpisode } from '../types.js';
import { groupsWithSpread, shapeOverlong, type DynamicSamplingOptions, type OverlongOptions } from './dapo.js';

/** A learning-rate schedule whose length defaults to the stage's steps. */
export type StageSchedule = Omit<ScheduleSpec, 'totalSteps'> & { totalSteps?: number };

/** The learning rate at `step` of a stage of `steps` steps. */
export function stageLearningRate(s: StageSchedule, steps: number, step: number): number {
  return learningRate({ ...s, totalSteps: s.totalSteps ?? steps }, step);
}

/** What the loop itself needs (every algorithm's options extend it). */
export interface RlLoopOptions {
  lora: LoraSpec;
  questionsPerStep: number;
  steps: number;
  temperature: number | [number, number];
  /** rollout.top_p: a range is drawn per rollout (rolloutTopP); one value is the runner's. */
  topP?: number | [number, number];
  seed: number;
  checkpointEvery?: number;
  resume?: boolean;
  /** Keep the adapter already on the model (e.g. from SFT) instead of attaching a fresh one. */
  keepAdapter?: boolean;
  /**
   * The KL reference policy: 'start' (default) = the adapter the stage starts from, frozen (the SFT
   * policy, as TRL and verl keep the initial policy as reference), or the base model without one;
   * 'base' = the base model (adapter off) even when starting from an adapter.
   */
  klReference?: 'start' | 'base';
  stopAfter?: number;
  /** Called after each step's metrics row (awaited: e.g. an evaluation every N steps). */
  onStep?: (row: Record<string, unknown>) => void | Promise<void>;
  /** Where the steps' progress bar goes (default: none). */
  progress?: ProgressTo;
  /**
   * Data-parallel rank (lib/distributed): this process rolls out and scores its share of each step's
   * questions (the model's trainStep all-reduces the gradients); metrics cover every rank.
   */
  shard?: Shard;
  /**
   * Over-long episodes (lib/train/rl/dapo.ts, algorithm.overlong): the soft penalty added to their
   * reward, truncated ones left out of the loss with `filter`. Absent: rewards as scored.
   */
  overlong?: OverlongOptions;
  /**
   * DAPO's dynamic sampling (rollout.dynamic_sampling; group algorithms): groups whose rewards are all
   * equal are dropped and the next batch of questions drawn, until questionsPerStep groups have a
   * spread or maxDraws batches were drawn. Every draw moves the data position on. One process only.
   */
  dynamicSampling?: DynamicSamplingOptions;
}

/** One step's data as the algorithm sees it. */
export interface RlStep<Q> {
  model: Model;
  /** The step about to run, 0-based (the metrics row's `step` is this + 1). */
  step: number;
  requests: RolloutRequest<Q>[];
  /** This rank's episodes and their rewards, in request order. */
  episodes: TrainEpisode[];
  rewards: RewardResult[];
  /** The global index of this rank's first episode (0 in one process). */
  offset: number;
  shard?: Shard;
}

/** The metrics row's algorithm part: `head` goes before the rollout metrics (lr...), `body` after them. */
export interface RlRow {
  head: Record<string, unknown>;
  body: Record<string, unknown>;
}

/**
 * An RL algorithm as the loop runs it. `A` is what its advantages phase computes, `U` what its update
 * returns, `S` what each rank shares for the metrics row (JSON; gathered with the rollouts).
 */
export interface RlAlgorithm<Q, A, U, S = null> {
  /** The metrics rows' `stage` and the progress bar's label. */
  name: string;
  /** Rollouts per question. */
  groupSize: number;
  /** When the advantages phase is reported on its own: its metrics key and its progress line. */
  prepare?: { timer: string; detail: string };
  /** After the stage's adapter is in place (fresh: a new adapter was attached; dir: the run folder). */
  begin?(model: Model, o: { fresh: boolean; resume: boolean; dir: string }): void;
  advantages(s: RlStep<Q>): Promise<A>;
  /** Episodes the update trains on (for the progress line). */
  trained(a: A): number;
  update(s: RlStep<Q>, a: A): Promise<U>;
  /** What episode i's trajectories line adds (its advantage, value...). */
  trajectory(s: RlStep<Q>, a: A, i: number): Record<string, unknown>;
  /** This rank's part of the row's statistics, gathered from every rank in rank order. */
  share(s: RlStep<Q>, a: A, u: U): S;
  /** The metrics row's algorithm keys, from every rank's episodes, rewards and shares. */
  row(s: RlStep<Q>, a: A, u: U, all: { episodes: TrainEpisode[]; rewards: RewardResult[]; shared: S[] }): RlRow;
}

/**
 * Top-p of rollout j of question q at `step`, drawn from [lo, hi] (rollout.top_p as a range, as the
 * reference code-search system draws it per rollout) on a stream of its own; undefined for one value.
 */
export function rolloutTopP(
  topP: number | [number, number] | undefined,
  seed: number,
  step: number,
  q: number,
  j: number,
): number | undefined {
  if (!Array.isArray(topP)) return undefined;
  return topP[0] + (topP[1] - topP[0]) * hashUniform(seed + 0x5bd1e995, step, q, j);
}

/**
 * A step's rollout requests, k per question: temperature (and top-p, for a range) drawn per rollout
 * and seeds from the question's index in the whole step (q0 = this rank's first), so that ranks and
 * resumed runs draw the same. RFT (lib/train/rl/rft.ts) draws its rounds' episodes the same way.
 */
export function rolloutRequests<Q>(
  qs: Q[],
  q0: number,
  k: number,
  step: number,
  loop: Pick<RlLoopOptions, 'temperature' | 'topP' | 'seed'>,
): RolloutRequest<Q>[] {
  const [lo, hi] = typeof loop.temperature === 'number' ? [loop.temperature, loop.temperature] : loop.temperature;
  return qs.flatMap((question, qi) =>
    Array.from({ length: k }, (_, j) => ({
      question,
      temperature: lo + (hi - lo) * hashUniform(loop.seed, step, q0 + qi, j),
      topP: rolloutTopP(loop.topP, loop.seed, step, q0 + qi, j),
      seed: loop.seed * 7919 + step * 1009 + (q0 + qi) * k + j,
    })),
  );
}

/**
 * The start of an RL stage: the KL reference (with klReference 'start' and an adapter to start from,
 * that adapter frozen, set before a checkpoint replaces the trained one on resume), then the trained
 * adapter: restored from the newest checkpoint with `resume`, the adapter already on the model with
 * keepAdapter, else a fresh one. `fresh`: a new adapter was attached.
 */
async function beginStage(model: Model, run: RunFolder, loop: RlLoopOptions): Promise<{ state: TrainState; fresh: boolean }> {
  const start = loop.keepAdapter === true && model.lora !== undefined;
  if (start && (loop.klReference ?? sectionDefaults('algorithm').kl_reference) === 'start') model.setReferenceAdapter();
  else model.clearReferenceAdapter();
  if (loop.resume) return { state: await run.restore(model), fresh: false };
  if (!start) model.attachLora(loop.lora, loop.seed);
  return { state: { step: 0, epoch: 0, batchInEpoch: 0, seed: loop.seed }, fresh: !start };
}

/**
 * The end of a step: the metrics row (logged, shown, handed to onStep), the trajectories (rank 0
 * records every rank's, in the global batch's order), the data position advanced, and a checkpoint
 * every `checkpointEvery` steps. Returns the new state.
 */
async function endStep(
  model: Model,
  run: RunFolder,
  bar: Progress,
  row: Record<string, unknown>,
  lines: string[],
  state: TrainState,
  position: Position,
  loop: RlLoopOptions,
): Promise<TrainState> {
  run.logMetrics(row);
  bar.update(state.step + 1, { reward: row.reward_mean as number, accuracy: row.accuracy as number | undefined, detail: '' });
  await loop.onStep?.(row);
  // A step without episodes (dynamic sampling that found no group with a spread) adds no line.
  if ((!loop.shard || loop.shard.rank === 0) && lines.length) appendFileSync(join(run.dir, 'trajectories.jsonl'), lines.join('\n') + '\n');
  const after = { ...state, step: state.step + 1, ...position };
  if (loop.checkpointEvery && after.step % loop.checkpointEvery === 0) await run.saveCheckpoint(model, after);
  return after;
}

const since = (t: number) => (performance.now() - t) / 1e3;

/** The data position: the batch of the seeded order that comes next. */
type Position = Pick<TrainState, 'epoch' | 'batchInEpoch'>;

/** The position after one batch of `perEpoch` per epoch. */
function nextPosition(p: Position, perEpoch: number): Position {
  const next = p.batchInEpoch + 1;
  return next >= perEpoch ? { epoch: p.epoch + 1, batchInEpoch: 0 } : { epoch: p.epoch, batchInEpoch: next };
}

/** What one step drew: the groups it trains on (requests, episodes, rewards in order) and its counts. */
interface Drawn<Q> {
  requests: RolloutRequest<Q>[];
  episodes: TrainEpisode[];
  rewards: RewardResult[];
  /** This rank's first question's index in the step. */
  q0: number;
  position: Position;
  /** Metrics of the over-long rules and of dynamic sampling (absent when off). */
  metrics: Record<string, unknown>;
  /** Seconds spent rolling out and scoring, over every draw. */
  rolloutS: number;
  rewardS: number;
}

/**
 * Step 1 and 2 of the loop: the next batch of questions rolled out and scored (over-long rules
 * applied); with dynamic sampling, more batches until the step has questionsPerStep groups with a
 * spread of rewards (the surplus of the last batch left out) or maxDraws batches were drawn.
 */
async function drawStep<Q>(
  questions: Q[],
  deps: RlDeps<Q>,
  k: number,
  step: number,
  start: Position,
  perEpoch: number,
  bar: Progress,
  loop: RlLoopOptions,
): Promise<Drawn<Q>> {
  const ds = loop.dynamicSampling;
  if (ds && k < 2)
    throw new SlmError(
      'CONFIG_INVALID',
      `dynamic sampling keeps groups whose rewards differ, which takes at least 2 rollouts per question; found ${k}.`,
      { path: 'rollout.dynamic_sampling.enabled' },
    );
  const maxDraws = ds ? ds.maxDraws : 1;
  if (!Number.isInteger(maxDraws) || maxDraws < 1)
    throw new SlmError('CONFIG_INVALID', `dynamic sampling's maxDraws must be a positive integer, found ${maxDraws}.`, {
      path: 'rollout.dynamic_sampling.max_draws',
    });
  const out: Drawn<Q> = { requests: [], episodes: [], rewards: [], q0: 0, position: start, metrics: {}, rolloutS: 0, rewardS: 0 };
  let truncated = 0;
  let filtered = 0;
  let penalized = 0;
  let drawnGroups = 0;
  let spreadGroups = 0;
  let rewardSum = 0;
  let rewardCount = 0;
  let draws = 0;
  // Data-parallel ranks: the groups kept so far by each rank, the same count on every rank.
  const keptByRank = Array.from({ length: loop.shard?.world ?? 1 }, () => 0);
  const want = loop.questionsPerStep;
  while (draws < maxDraws) {
    const p = out.position;
    const order = permutation(questions.length, loop.seed, p.epoch);
    const stepQs = order
      .slice(p.batchInEpoch * loop.questionsPerStep, (p.batchInEpoch + 1) * loop.questionsPerStep)
      .map((i) => questions[i]);
    // This rank's share (all of it in one process); temperatures and seeds by the global index,
    // later draws of a step numbered after the earlier ones'.
    const [q0, q1] = loop.shard ? shardRange(stepQs.length, loop.shard.rank, loop.shard.world) : [0, stepQs.length];
    if (draws === 0) out.q0 = q0;
    const qs = stepQs.slice(q0, q1);
    const requests = rolloutRequests(qs, draws * loop.questionsPerStep + q0, k, step, loop);
    const tag = draws ? ` (draw ${draws + 1})` : '';
    bar.set({ detail: `rollouts 0/${requests.length}${tag}` });
    const t0 = performance.now();
    const episodes = await deps.rollout(requests, (done, total) => bar.set({ detail: `rollouts ${done}/${total}${tag}` }));
    if (episodes.length !== requests.length)
      throw new SlmError('ARGUMENT_INVALID', `rollout returned ${episodes.length} episodes for ${requests.length} requests.`);
    out.rolloutS += since(t0);
    bar.set({ detail: 'reward' });
    const t1 = performance.now();
    let rewards = await Promise.all(episodes.map((ep, i) => deps.reward(ep, requests[i].question)));
    out.rewardS += since(t1);
    if (loop.overlong) {
      const shaped = shapeOverlong(episodes, rewards, loop.overlong);
      rewards = shaped.rewards;
      truncated += shaped.truncated;
      filtered += shaped.filtered;
      penalized += shaped.penalized;
    }
    out.position = nextPosition(p, perEpoch);
    draws++;
    if (!ds) {
      Object.assign(out, { requests, episodes, rewards });
      break;
    }
    const spread = groupsWithSpread(rewards, k);
    // Every rank sees every rank's spreads (rank order = the draw's question order) and keeps the
    // same global selection: the first groups with a spread, up to questionsPerStep in all.
    const mine = { spread, sum: rewards.reduce((a, r) => a + r.total, 0), n: rewards.length };
    const all = loop.shard ? await loop.shard.allGather(mine) : [mine];
    all.forEach((r, rank) => {
      drawnGroups += r.spread.length;
      spreadGroups += r.spread.filter(Boolean).length;
      rewardSum += r.sum;
      rewardCount += r.n;
      for (let g = 0; g < r.spread.length; g++) {
        if (!r.spread[g] || keptByRank.reduce((a, b) => a + b, 0) >= want) continue;
        keptByRank[rank]++;
        if (rank !== (loop.shard?.rank ?? 0)) continue;
        out.requests.push(...requests.slice(g * k, (g + 1) * k));
        out.episodes.push(...episodes.slice(g * k, (g + 1) * k));
        out.rewards.push(...rewards.slice(g * k, (g + 1) * k));
      }
    });
    if (keptByRank.reduce((a, b) => a + b, 0) >= want) break;
  }
  // This rank's first kept question in the step's kept list (the ranks' kept groups in rank order).
  if (ds && loop.shard) out.q0 = keptByRank.slice(0, loop.shard.rank).reduce((a, b) => a + b, 0);
  if (loop.overlong)
    Object.assign(out.metrics, {
      episodes_truncated: truncated,
      episodes_overlong_filtered: loop.overlong.filter ? filtered : undefined,
      episodes_overlong_penalized: loop.overlong.buffer > 0 ? penalized : undefined,
    });
  if (ds)
    Object.assign(out.metrics, {
      dynamic_draws: draws,
      groups_drawn: drawnGroups,
      groups_with_spread: spreadGroups,
      groups_trained_on: keptByRank.reduce((a, b) => a + b, 0),
      reward_mean_drawn: rewardCount ? rewardSum / rewardCount : NaN,
    });
  return out;
}

/** Runs `algo` for `o.steps` steps (or `o.stopAfter` of them); the mean reward of every step run here. */
export async function runRl<Q, A, U, S>(
  model: Model,
  questions: Q[],
  run: RunFolder,
  deps: RlDeps<Q>,
  algo: RlAlgorithm<Q, A, U, S>,
  loop: RlLoopOptions,
): Promise<{ steps: number; meanReward: number[] }> {
  const k = algo.groupSize;
  const perEpoch = Math.max(1, Math.floor(questions.length / loop.questionsPerStep));
  // The schedule recorded in checkpoints, checked on resume (GRPO, RLOO and PPO options carry it).
  const schedule = (loop as RlLoopOptions & { schedule?: StageSchedule }).schedule;
  if (schedule) run.schedule = { ...schedule, totalSteps: schedule.totalSteps ?? loop.steps };
  const begun = await beginStage(model, run, loop);
  algo.begin?.(model, { fresh: begun.fresh, resume: loop.resume === true, dir: run.dir });
  let state = begun.state;
  const rewardsByStep: number[] = [];
  let ranHere = 0;
  const bar = new Progress(algo.name, loop.steps, 'steps', loop.progress, state.step);
  try {
    while (state.step < loop.steps) {
      if (loop.stopAfter !== undefined && ranHere >= loop.stopAfter) break;
      // 1. rollouts and 2. rewards (with dynamic sampling, as many draws as it takes)
      const t0 = performance.now();
      const drawn = await drawStep(questions, deps, k, state.step, state, perEpoch, bar, loop);
      const { requests, episodes, rewards, q0 } = drawn;
      const s: RlStep<Q> = { model, step: state.step, requests, episodes, rewards, offset: q0 * k, shard: loop.shard };
      // 3. advantages
      if (algo.prepare) bar.set({ detail: algo.prepare.detail });
      const t2 = performance.now();
      const adv = await algo.advantages(s);
      const tPrepare = since(t2);
      // 4. update
      bar.set({ detail: `train (${algo.trained(adv)} episodes)` });
      const t3 = performance.now();
      const upd = await algo.update(s, adv);
      const tTrain = since(t3);
      // 5. logs
      const lines = episodes.map((e, i) => trajectoryLine(state.step + 1, requests[i].question, e, rewards[i], algo.trajectory(s, adv, i)));
      const shared = algo.share(s, adv, upd);
      const all = loop.shard
        ? await gatherRollouts(loop.shard, episodes, rewards, lines, shared)
        : { episodes, rewards, lines, shared: [shared] };
      const { head, body } = algo.row(s, adv, upd, all);
      const row: Record<string, unknown> = {
        stage: algo.name,
        step: state.step + 1,
        ...head,
        ...rolloutMetrics(all.episodes, all.rewards),
        ...drawn.metrics,
        ...body,
        time_rollout_s: drawn.rolloutS,
        time_reward_s: drawn.rewardS,
        ...(algo.prepare ? { [algo.prepare.timer]: tPrepare } : {}),
        time_train_s: tTrain,
        time_step_s: since(t0),
      };
      rewardsByStep.push(mean(all.rewards.map((r) => r.total)));
      state = await endStep(model, run, bar, row, all.lines, state, drawn.position, loop);
      ranHere++;
    }
  } finally {
    bar.stop();
  }
  if (state.step >= loop.steps) await run.saveCheckpoint(model, state);
  return { steps: state.step, meanReward: rewardsByStep };
}
