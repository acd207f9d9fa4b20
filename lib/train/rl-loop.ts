/**
 * The one RL loop. Every step, whatever the algorithm:
 *   1. rollouts: the next questions (seeded order, resumable; this rank's share of them), `groupSize`
 *      rollouts each, temperature and top-p drawn per rollout, seeds from the question's index in the
 *      whole step — timed as time_rollout_s;
 *   2. score: every episode's reward (each part kept for the logs) — time_reward_s;
 *   3. advantages: the algorithm's (group-relative, leave-one-out, GAE with a critic...) — timed
 *      under the algorithm's `prepare.timer` when it names one (PPO: time_prepare_s, its forward
 *      passes);
 *   4. update: the algorithm's optimizer steps — time_train_s;
 *   5. log and checkpoint: one metrics row (rollout metrics over every rank, then the algorithm's),
 *      the trajectories JSONL, the data position advanced, a checkpoint every `checkpointEvery`.
 * An algorithm is an `RlAlgorithm` (lib/train/grpo.ts, ppo.ts, rloo.ts): adding one means one file.
 */
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Model } from '../engine/model.js';
import type { LoraSpec } from '../engine/adapter.js';
import { SlmError } from '../errors.js';
import { Progress, type ProgressTo } from '../util/progress.js';
import { hashUniform } from '../util/hash.js';
import { sectionDefaults } from '../config/schema.js';
import { learningRate, type ScheduleSpec } from './schedule.js';
import { permutation, type RunFolder, type TrainState } from './run.js';
import { mean, rolloutMetrics, trajectoryLine } from './rollout-metrics.js';
import { shardRange } from '../distributed/data-parallel.js';
import { gatherRollouts } from '../distributed/gather.js';
import type { Shard } from '../distributed/run.js';
import type { RewardResult, RlDeps, RolloutRequest, TrainEpisode } from './types.js';

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
export function rolloutTopP(topP: number | [number, number] | undefined, seed: number, step: number, q: number, j: number): number | undefined {
  if (!Array.isArray(topP)) return undefined;
  return topP[0] + (topP[1] - topP[0]) * hashUniform(seed + 0x5bd1e995, step, q, j);
}

/**
 * A step's rollout requests, k per question: temperature (and top-p, for a range) drawn per rollout
 * and seeds from the question's index in the whole step (q0 = this rank's first), so that ranks and
 * resumed runs draw the same. RFT (lib/train/rft.ts) draws its rounds' episodes the same way.
 */
export function rolloutRequests<Q>(qs: Q[], q0: number, k: number, step: number, o: Pick<RlLoopOptions, 'temperature' | 'topP' | 'seed'>): RolloutRequest<Q>[] {
  const [lo, hi] = typeof o.temperature === 'number' ? [o.temperature, o.temperature] : o.temperature;
  return qs.flatMap((question, qi) =>
    Array.from({ length: k }, (_, j) => ({
      question,
      temperature: lo + (hi - lo) * hashUniform(o.seed, step, q0 + qi, j),
      topP: rolloutTopP(o.topP, o.seed, step, q0 + qi, j),
      seed: o.seed * 7919 + step * 1009 + (q0 + qi) * k + j,
    })),
  );
}

/**
 * The start of an RL stage: the KL reference (with klReference 'start' and an adapter to start from,
 * that adapter frozen, set before a checkpoint replaces the trained one on resume), then the trained
 * adapter: restored from the newest checkpoint with `resume`, the adapter already on the model with
 * keepAdapter, else a fresh one. `fresh`: a new adapter was attached.
 */
async function beginStage(model: Model, run: RunFolder, o: RlLoopOptions): Promise<{ state: TrainState; fresh: boolean }> {
  const start = o.keepAdapter === true && model.lora !== undefined;
  if (start && (o.klReference ?? sectionDefaults('algorithm').kl_reference) === 'start') model.setReferenceAdapter();
  else model.clearReferenceAdapter();
  if (o.resume) return { state: await run.restore(model), fresh: false };
  if (!start) model.attachLora(o.lora, o.seed);
  return { state: { step: 0, epoch: 0, batchInEpoch: 0, seed: o.seed }, fresh: !start };
}

/**
 * The end of a step: the metrics row (logged, shown, handed to onStep), the trajectories (rank 0
 * records every rank's, in the global batch's order), the data position advanced, and a checkpoint
 * every `checkpointEvery` steps. Returns the new state.
 */
async function endStep(model: Model, run: RunFolder, bar: Progress, row: Record<string, unknown>, lines: string[], state: TrainState, perEpoch: number, o: RlLoopOptions): Promise<TrainState> {
  run.logMetrics(row);
  bar.update(state.step + 1, { reward: row.reward_mean as number, accuracy: row.accuracy as number | undefined, detail: '' });
  await o.onStep?.(row);
  if (!o.shard || o.shard.rank === 0) appendFileSync(join(run.dir, 'trajectories.jsonl'), lines.join('\n') + '\n');
  const next = state.batchInEpoch + 1;
  const after = { ...state, step: state.step + 1, epoch: next >= perEpoch ? state.epoch + 1 : state.epoch, batchInEpoch: next >= perEpoch ? 0 : next };
  if (o.checkpointEvery && after.step % o.checkpointEvery === 0) await run.saveCheckpoint(model, after);
  return after;
}

const since = (t: number) => (performance.now() - t) / 1e3;

/** Runs `algo` for `o.steps` steps (or `o.stopAfter` of them); the mean reward of every step run here. */
export async function runRl<Q, A, U, S>(model: Model, questions: Q[], run: RunFolder, deps: RlDeps<Q>, algo: RlAlgorithm<Q, A, U, S>, o: RlLoopOptions): Promise<{ steps: number; meanReward: number[] }> {
  const k = algo.groupSize;
  const perEpoch = Math.max(1, Math.floor(questions.length / o.questionsPerStep));
  const begun = await beginStage(model, run, o);
  algo.begin?.(model, { fresh: begun.fresh, resume: o.resume === true, dir: run.dir });
  let state = begun.state;
  const rewardsByStep: number[] = [];
  let ranHere = 0;
  const bar = new Progress(algo.name, o.steps, 'steps', o.progress, state.step);
  try {
    while (state.step < o.steps) {
      if (o.stopAfter !== undefined && ranHere >= o.stopAfter) break;
      const order = permutation(questions.length, o.seed, state.epoch);
      const stepQs = order.slice(state.batchInEpoch * o.questionsPerStep, (state.batchInEpoch + 1) * o.questionsPerStep).map((i) => questions[i]);
      // This rank's share (all of it in one process); temperatures and seeds by the global index.
      const [q0, q1] = o.shard ? shardRange(stepQs.length, o.shard.rank, o.shard.world) : [0, stepQs.length];
      const qs = stepQs.slice(q0, q1);
      // 1. rollouts
      const t0 = performance.now();
      const requests = rolloutRequests(qs, q0, k, state.step, o);
      bar.set({ detail: `rollouts 0/${requests.length}` });
      const episodes = await deps.rollout(requests, (done, total) => bar.set({ detail: `rollouts ${done}/${total}` }));
      if (episodes.length !== requests.length) throw new SlmError('ARGUMENT_INVALID', `rollout returned ${episodes.length} episodes for ${requests.length} requests.`);
      const tRollout = since(t0);
      // 2. rewards
      bar.set({ detail: 'reward' });
      const t1 = performance.now();
      const rewards = await Promise.all(episodes.map((ep, i) => deps.reward(ep, requests[i].question)));
      const tReward = since(t1);
      const s: RlStep<Q> = { model, step: state.step, requests, episodes, rewards, offset: q0 * k, shard: o.shard };
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
      const all = o.shard ? await gatherRollouts(o.shard, episodes, rewards, lines, shared) : { episodes, rewards, lines, shared: [shared] };
      const { head, body } = algo.row(s, adv, upd, all);
      const row: Record<string, unknown> = {
        stage: algo.name,
        step: state.step + 1,
        ...head,
        ...rolloutMetrics(all.episodes, all.rewards),
        ...body,
        time_rollout_s: tRollout,
        time_reward_s: tReward,
        ...(algo.prepare ? { [algo.prepare.timer]: tPrepare } : {}),
        time_train_s: tTrain,
        time_step_s: since(t0),
      };
      rewardsByStep.push(mean(all.rewards.map((r) => r.total)));
      state = await endStep(model, run, bar, row, all.lines, state, perEpoch, o);
      ranHere++;
    }
  } finally {
    bar.stop();
  }
  if (state.step >= o.steps) await run.saveCheckpoint(model, state);
  return { steps: state.step, meanReward: rewardsByStep };
}
