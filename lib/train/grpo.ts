/**
 * GRPO over real episodes. One step:
 *   1. take the next questions (seeded order, resumable), K rollouts each, every rollout with its own
 *      temperature drawn from the configured range (seeded by step and index);
 *   2. score every episode (each reward part kept for the logs);
 *   3. group advantages (lib/train/advantages.ts: (r - mean) / std, the reference fallbacks, Dr.GRPO);
 *      skipped groups contribute no episode;
 *   4. `innerEpochs` optimizer steps on the kept episodes: clipped policy gradient against the
 *      sampling log-probs, optional KL to the reference (adapter off), token- or sequence-level;
 *   5. metrics row, trajectories JSONL, checkpoints.
 * How this departs from the GRPO paper: old log-probs are the sampling log-probs (no separate
 * old-policy forward), KL is off by default (as Dr.GRPO and the reference project), and one group is
 * one question's K rollouts.
 */
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Model } from '../engine/model.js';
import type { LoraSpec } from '../engine/adapter.js';
import { Progress, type ProgressTo } from '../util/progress.js';
import { learningRate, type ScheduleSpec } from './schedule.js';
import { permutation, type RunFolder, type TrainState } from './run.js';
import { mean, rolloutMetrics, trajectoryLine } from './rollout-metrics.js';
import { shardRange } from '../distributed/data-parallel.js';
import { gatherRollouts } from '../distributed/gather.js';
import { episodeTokenAdvantages, turnCounts, type LossNorm, type TurnCounts } from './advantages.js';
import { SlmError } from '../errors.js';
import type { Shard } from '../distributed/run.js';

/** What the trainer needs of an episode (the EpisodeRunner returns more). */
export interface TrainEpisode {
  ids: Int32Array;
  /** 1 on model-generated tokens only. */
  lossMask: Uint8Array;
  /** Sampling log-probs aligned with ids (0 where the mask is 0). */
  logprobs: Float32Array;
  temperature: number;
  answer: string | null;
  turns: number;
  /** Anything worth saving in the trajectories file (messages, calls, finish reason...). */
  record?: Record<string, unknown>;
}

export interface RolloutRequest<Q> {
  question: Q;
  temperature: number;
  /** Drawn per rollout when the config gives a top-p range; else the runner's top-p applies. */
  topP?: number;
  seed: number;
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
 * resumed runs draw the same. GRPO and PPO both use it.
 */
export function rolloutRequests<Q>(
  qs: Q[],
  q0: number,
  k: number,
  step: number,
  o: { seed: number; temperature: number | [number, number]; topP?: number | [number, number] },
): RolloutRequest<Q>[] {
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

export interface RewardResult {
  total: number;
  parts: Record<string, number | null>;
  correct?: boolean;
  /** Why a part is null (a failed judge call...), by part name. */
  errors?: Record<string, string>;
  /**
   * True when a reward component failed (a judge call that errored or gave an unparseable reply):
   * `total` then holds the configured penalty (reward.failure_value) and `errors` says why. Absent
   * when every component worked.
   */
  failed?: boolean;
  /**
   * reward.on_failure: exclude — the trainers leave this episode out of the loss (and out of its
   * GRPO group's statistics) and count it (episodes_excluded).
   */
  excluded?: boolean;
}

/**
 * Per group (one question's K rewards, and their correctness flags when every reward has one):
 * advantages, or null to skip the group, with a reason.
 */
export type GroupAdvantages = (rewards: number[], correct?: boolean[]) => { advantages: number[] | null; reason?: string };

/** Rollouts of a batch; `onProgress` (when given) hears how many episodes have finished. */
export type RolloutFn<Q> = (batch: RolloutRequest<Q>[], onProgress?: (finished: number, total: number) => void) => Promise<TrainEpisode[]>;

export interface GrpoDeps<Q> {
  rollout: RolloutFn<Q>;
  reward(ep: TrainEpisode, q: Q): Promise<RewardResult>;
  advantages: GroupAdvantages;
}

export interface GrpoOptions {
  lora: LoraSpec;
  k: number;
  questionsPerStep: number;
  steps: number;
  temperature: number | [number, number];
  /** rollout.top_p: a range is drawn per rollout (rolloutTopP); one value is the runner's. */
  topP?: number | [number, number];
  innerEpochs?: number;
  clipLow?: number;
  clipHigh?: number;
  klCoef?: number;
  klEstimator?: 'k1' | 'k3';
  /**
   * How the loss averages (algorithm.loss_norm): 'token' (default; DAPO, Dr.GRPO), 'sequence' (the
   * GRPO paper), 'turn' (the reference: per assistant turn, then over the batch's turns).
   */
  lossNorm?: LossNorm;
  /** Turn j of J carries the advantage x turnDiscount^(J - 1 - j) (the reference: 0.99; default 1). */
  turnDiscount?: number;
  schedule: Omit<ScheduleSpec, 'totalSteps'> & { totalSteps?: number };
  weightDecay?: number;
  maxGradNorm?: number;
  /** AdamW's betas and eps (optim.betas, optim.eps); default 0.9, 0.999, 1e-8. */
  adam?: AdamOptions;
  /** Entropy bonus coefficient (the loss subtracts coef x the mean entropy of the trained tokens). */
  entropyCoef?: number;
  microBatch?: number;
  gradientCheckpointing?: boolean;
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
   * Data-parallel rank (lib/distributed): this process rolls out and trains its share of each step's
   * questions (the model's trainStep all-reduces the gradients); metrics cover every rank.
   */
  shard?: Shard;
}

/** AdamW's moment decay rates and epsilon, as the native trainStep takes them. */
export interface AdamOptions {
  beta1: number;
  beta2: number;
  eps: number;
}

/** A seeded uniform in [0, 1) from integers (splitmix-style), for per-rollout temperatures. */
export function hashUniform(...xs: number[]): number {
  let h = 0x9e3779b9;
  for (const x of xs) {
    h ^= Math.imul(x | 0, 0x85ebca6b) + 0x6b43a9b5 + (h << 6) + (h >>> 2);
    h = Math.imul(h ^ (h >>> 15), 0x2c1b3c6d);
    h ^= h >>> 12;
  }
  return (h >>> 0) / 4294967296;
}

/**
 * The start of an RL stage, shared by GRPO and PPO: the KL reference (with klReference 'start' and an
 * adapter to start from, that adapter frozen, set before a checkpoint replaces the trained one on
 * resume), then the trained adapter: restored from the newest checkpoint with `resume`, the adapter
 * already on the model with keepAdapter, else a fresh one. `fresh`: a new adapter was attached.
 */
export async function beginStage(
  model: Model,
  run: RunFolder,
  o: { resume?: boolean; keepAdapter?: boolean; klReference?: 'start' | 'base'; lora: LoraSpec; seed: number },
): Promise<{ state: TrainState; fresh: boolean }> {
  const start = o.keepAdapter === true && model.lora !== undefined;
  if (start && (o.klReference ?? 'start') === 'start') model.setReferenceAdapter();
  else model.clearReferenceAdapter();
  if (o.resume) return { state: await run.restore(model), fresh: false };
  if (!start) model.attachLora(o.lora, o.seed);
  return { state: { step: 0, epoch: 0, batchInEpoch: 0, seed: o.seed }, fresh: !start };
}

/**
 * The end of an RL step, shared by GRPO and PPO: the metrics row (logged, shown, handed to onStep),
 * the trajectories (rank 0 records every rank's, in the global batch's order), the data position
 * advanced, and a checkpoint every `checkpointEvery` steps. Returns the new state.
 */
export async function endStep(c: {
  model: Model;
  run: RunFolder;
  bar: Progress;
  row: Record<string, unknown>;
  lines: string[];
  state: TrainState;
  perEpoch: number;
  shard?: Shard;
  onStep?: (row: Record<string, unknown>) => void | Promise<void>;
  checkpointEvery?: number;
}): Promise<TrainState> {
  const { row, state } = c;
  c.run.logMetrics(row);
  c.bar.update(state.step + 1, { reward: row.reward_mean as number, accuracy: row.accuracy as number | undefined, detail: '' });
  await c.onStep?.(row);
  if (!c.shard || c.shard.rank === 0) appendFileSync(join(c.run.dir, 'trajectories.jsonl'), c.lines.join('\n') + '\n');
  const next = state.batchInEpoch + 1;
  const after = { ...state, step: state.step + 1, epoch: next >= c.perEpoch ? state.epoch + 1 : state.epoch, batchInEpoch: next >= c.perEpoch ? 0 : next };
  if (c.checkpointEvery && after.step % c.checkpointEvery === 0) await c.run.saveCheckpoint(c.model, after);
  return after;
}

export async function runGrpo<Q>(model: Model, questions: Q[], run: RunFolder, deps: GrpoDeps<Q>, o: GrpoOptions): Promise<{ steps: number; meanReward: number[] }> {
  const perEpoch = Math.max(1, Math.floor(questions.length / o.questionsPerStep));
  const schedule: ScheduleSpec = { ...o.schedule, totalSteps: o.schedule.totalSteps ?? o.steps };
  let { state } = await beginStage(model, run, o);
  const rewardsByStep: number[] = [];
  let ranHere = 0;
  const bar = new Progress('grpo', o.steps, 'steps', o.progress, state.step);
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
      const reqs = rolloutRequests(qs, q0, o.k, state.step, o);
      bar.set({ detail: `rollouts 0/${reqs.length}` });
      const episodes = await deps.rollout(reqs, (done, total) => bar.set({ detail: `rollouts ${done}/${total}` }));
      const tRollout = (performance.now() - t0) / 1e3;
      // 2. rewards
      bar.set({ detail: 'reward' });
      const t1 = performance.now();
      const rewards = await Promise.all(episodes.map((ep, i) => deps.reward(ep, reqs[i].question)));
      const tReward = (performance.now() - t1) / 1e3;
      // 3. group advantages
      const adv: Array<number | null> = [];
      const skipped: string[] = [];
      for (let g = 0; g < qs.length; g++) {
        const group = rewards.slice(g * o.k, (g + 1) * o.k);
        // reward.on_failure: exclude — an episode whose reward failed (a judge call) is left out of
        // its group's statistics and of the loss, and counted.
        const members = group.map((_, j) => j).filter((j) => group[j].excluded !== true);
        const scored = members.map((j) => group[j]);
        // Correctness flags when the reward gives them; an episode without one (a failed judge call)
        // counts as not correct rather than switching the flags off for its whole group.
        const a = scored.length
          ? deps.advantages(
              scored.map((x) => x.total),
              scored.some((x) => typeof x.correct === 'boolean') ? scored.map((x) => x.correct === true) : undefined,
            )
          : { advantages: null, reason: 'all_excluded' };
        if (!a.advantages) skipped.push(a.reason ?? 'skipped');
        const byMember = new Map(members.map((j, n) => [j, a.advantages ? a.advantages[n] : null]));
        for (let j = 0; j < o.k; j++) adv.push(byMember.get(j) ?? null);
      }
      const keep = episodes.map((_, i) => i).filter((i) => adv[i] !== null && adv[i] !== 0 && episodes[i].lossMask.some((x) => x));
      // 4. policy update
      bar.set({ detail: `train (${keep.length} episodes)` });
      const t2 = performance.now();
      const lr = learningRate(schedule, state.step);
      let stats: Awaited<ReturnType<Model['trainStep']>> | undefined;
      // Every rank takes part in every step's collectives, with or without episodes of its own.
      if (keep.length || o.shard) {
        const masks = keep.map((i) => episodes[i].lossMask);
        // loss_norm 'turn' weighs a token by the global batch's counts: ranks add theirs up.
        let totals: TurnCounts | undefined;
        if (o.shard && o.lossNorm === 'turn') {
          const all = await o.shard.allGather(turnCounts(masks));
          totals = { sequences: all.reduce((a, c) => a + c.sequences, 0), pairs: all.reduce((a, c) => a + c.pairs, 0) };
        }
        const batch = {
          sequences: keep.map((i) => episodes[i].ids),
          masks,
          advantages: episodeTokenAdvantages(
            keep.map((i) => adv[i] as number),
            masks,
            { turnDiscount: o.turnDiscount, norm: o.lossNorm, totals },
          ),
          oldLogprobs: keep.map((i) => episodes[i].logprobs),
          temperature: keep.map((i) => episodes[i].temperature),
        };
        for (let e = 0; e < (o.innerEpochs ?? 1); e++) {
          stats = await model.trainStep(batch, {
            loss: 'pg',
            seed: o.seed * 1000003 + state.step * 31 + e,
            lr,
            clipLow: o.clipLow ?? 0.2,
            clipHigh: o.clipHigh ?? o.clipLow ?? 0.2,
            klCoef: o.klCoef ?? 0,
            klEstimator: o.klEstimator ?? 'k3',
            entropyCoef: o.entropyCoef ?? 0,
            tokenLevel: (o.lossNorm ?? 'token') === 'token',
            weightDecay: o.weightDecay ?? 0,
            maxGradNorm: o.maxGradNorm ?? 1,
            ...o.adam,
            microBatch: o.microBatch,
            checkpoint: o.gradientCheckpointing ?? true,
          });
        }
      }
      const tTrain = (performance.now() - t2) / 1e3;
      // 5. logs
      const lines = episodes.map((e, i) => trajectoryLine(state.step + 1, reqs[i].question, e, rewards[i], { advantage: adv[i] }));
      const all = o.shard ? await gatherRollouts(o.shard, episodes, rewards, keep.map((i) => adv[i] as number), skipped, lines) : { episodes, rewards, kept: keep.map((i) => adv[i] as number), skipped, lines };
      const totals = all.rewards.map((r) => r.total);
      const kept = all.kept;
      const row: Record<string, unknown> = {
        stage: 'grpo',
        step: state.step + 1,
        lr,
        ...rolloutMetrics(all.episodes, all.rewards),
        episodes_trained: kept.length,
        episodes_excluded: all.rewards.filter((r) => r.excluded === true).length || undefined,
        groups_skipped: all.skipped.length,
        skip_reasons: all.skipped.length ? [...new Set(all.skipped)] : undefined,
        advantages_mean: kept.length ? mean(kept) : undefined,
        advantages_abs_mean: kept.length ? mean(kept.map(Math.abs)) : undefined,
        loss: stats?.loss,
        pg_loss: stats?.pgLoss,
        kl: stats?.kl,
        entropy: stats?.entropy,
        clip_frac: stats?.clipFrac,
        ratio_mean: stats?.ratio,
        grad_norm: stats?.gradNorm,
        update_skipped: stats?.skipped || undefined,
        time_rollout_s: tRollout,
        time_reward_s: tReward,
        time_train_s: tTrain,
        time_step_s: (performance.now() - t0) / 1e3,
      };
      rewardsByStep.push(mean(totals));
      state = await endStep({ model, run, bar, row, lines: all.lines, state, perEpoch, shard: o.shard, onStep: o.onStep, checkpointEvery: o.checkpointEvery });
      ranHere++;
    }
  } finally {
    bar.stop();
  }
  if (state.step >= o.steps) await run.saveCheckpoint(model, state);
  return { steps: state.step, meanReward: rewardsByStep };
}
