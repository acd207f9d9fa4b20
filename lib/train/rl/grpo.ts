/**
 * GRPO as an algorithm of the RL loop (lib/train/rl/rl-loop.ts):
 *   - advantages: per group (one question's K rollouts), lib/train/rl/advantages.ts `grpoAdvantages`
 *     with the configured rule ((r - mean) / std, the reference fallbacks, Dr.GRPO); skipped groups
 *     and excluded episodes contribute no episode;
 *   - update: `innerEpochs` optimizer steps on the kept episodes: clipped policy gradient against the
 *     sampling log-probs, optional KL to the reference (adapter off), token-, sequence- or turn-level.
 * How this departs from the GRPO paper: old log-probs are the sampling log-probs (no separate
 * old-policy forward), KL is off by default (as Dr.GRPO and the reference project), and one group is
 * one question's K rollouts.
 * Other group baselines reuse this file's update with their own advantage rule (lib/train/rl/rloo.ts).
 */
import type { Model } from '../../engine/model.js';
import { sectionDefaults } from '../../config/schema.js';
import { num, oneOf, section } from '../../config/schema-kit.js';
import type { AlgorithmConfig, ResolvedConfig } from '../../config/types.js';
import { stripUndefined } from '../../util/objects.js';
import { optimizerOptions, scheduleSpec } from '../schedule.js';
import type { RunFolder } from '../run.js';
import type { AdamOptions, GroupAdvantageFn, RlDeps } from '../types.js';
import {
  episodeTokenAdvantages,
  groupAdvantageFn,
  grpoAdvantages,
  turnCounts,
  turnScale,
  type GroupAdvantageOptions,
  type LossNorm,
  type TurnCounts,
} from './advantages.js';
import { SlmError } from '../../errors.js';
import { klProblem, type AlgorithmDefinition } from './algorithm.js';
import { runRl, stageLearningRate, type RlAlgorithm, type RlLoopOptions, type StageSchedule } from './rl-loop.js';
import { mean } from './rollout-metrics.js';

export interface GrpoDeps<Q> extends RlDeps<Q> {
  advantages: GroupAdvantageFn;
}

/** The policy-gradient update's options, shared by the group-baseline algorithms (GRPO, RLOO). */
export interface PgOptions extends RlLoopOptions {
  /** Rollouts per question (the group). */
  k: number;
  innerEpochs?: number;
  clipLow?: number;
  /** Default: clipLow. */
  clipHigh?: number;
  klCoef?: number;
  klEstimator?: 'k1' | 'k3';
  /**
   * How the loss averages (algorithm.loss_norm): 'token' (DAPO, Dr.GRPO), 'sequence' (the GRPO
   * paper), 'turn' (the reference: per assistant turn, then over the batch's turns).
   */
  lossNorm?: LossNorm;
  /** Turn j of J carries the advantage x turnDiscount^(J - 1 - j) (the reference: 0.99). */
  turnDiscount?: number;
  schedule: StageSchedule;
  weightDecay?: number;
  maxGradNorm?: number;
  /** AdamW's betas and eps (optim.betas, optim.eps). */
  adam?: AdamOptions;
  /**
   * Entropy bonus coefficient (the loss subtracts coef x the mean entropy of the trained tokens,
   * averaged as lossNorm says: per turn with 'turn').
   */
  entropyCoef?: number;
  /**
   * The ratio's old log-probs (algorithm.old_logprobs): 'forward' = the training forward's own,
   * detached (r = 1, one pass); otherwise those on the episodes (sampler or recomputed).
   */
  oldLogprobs?: 'sampler' | 'recompute' | 'forward';
  microBatch?: number;
  gradientCheckpointing?: boolean;
}

export type GrpoOptions = PgOptions;

/** The update's settings of an algorithm section (the config's, or the schema's defaults). */
function pgSettings(algorithm: AlgorithmConfig) {
  return {
    innerEpochs: algorithm.inner_epochs,
    clipLow: algorithm.clip_low,
    clipHigh: algorithm.clip_high ?? algorithm.clip_low,
    klCoef: algorithm.kl_coef,
    // The KL goes into the loss, which takes k3 (validation refuses anything else with a coefficient).
    klEstimator: 'k3' as const,
    entropyCoef: algorithm.entropy_coef,
    lossNorm: algorithm.loss_norm,
    turnDiscount: algorithm.turn_discount,
    oldLogprobs: algorithm.old_logprobs,
  };
}

/**
 * The group-baseline options (GRPO, RLOO) of a resolved config's algorithm, rollout and optim
 * sections; the loop's own options (questions per step, steps, seed...) come from the caller.
 */
export function pgOptionsFrom(
  c: ResolvedConfig,
): Pick<
  PgOptions,
  | 'k'
  | 'innerEpochs'
  | 'clipLow'
  | 'clipHigh'
  | 'klCoef'
  | 'klEstimator'
  | 'entropyCoef'
  | 'lossNorm'
  | 'turnDiscount'
  | 'oldLogprobs'
  | 'schedule'
> {
  return { k: c.rollout.k, ...pgSettings(c.algorithm), schedule: scheduleSpec(c) };
}

/**
 * GRPO's group rule as configured (lib/train/rl/advantages.ts). With `fallbacks.fail_by: correct` the
 * trainer passes each reward's correctness flag as the `success` argument (`useCorrectness`);
 * otherwise failure is reward <= fail_at_or_below.
 */
export function groupAdvantageOptions(cfg: ResolvedConfig): GroupAdvantageOptions & { useCorrectness: boolean } {
  const a = cfg.algorithm;
  return {
    std: a.std,
    stdEstimator: a.std_estimator,
    eps: a.adv_eps,
    flatStd: a.fallbacks.flat_std,
    flatSkipBelow: a.fallbacks.flat_skip_below,
    failAtOrBelow: a.fallbacks.fail_at_or_below,
    allFailed: a.fallbacks.all_failed,
    zeroVariance: a.fallbacks.zero_variance,
    center: a.fallbacks.center,
    useCorrectness: a.fallbacks.fail_by === 'correct',
  };
}

/** GRPO's group rule as configured: the correctness flags reach it with algorithm.fallbacks.fail_by: correct. */
export function configuredGroupAdvantages(cfg: ResolvedConfig): GroupAdvantageFn {
  const g = groupAdvantageOptions(cfg);
  const fn = groupAdvantageFn(g);
  return (rw, correct) => fn(rw, g.useCorrectness ? correct : undefined);
}

interface GroupStep {
  /** One per episode: null = no advantage (skipped group, excluded episode). */
  adv: Array<number | null>;
  /** The episodes trained on: an advantage other than 0 and a trained token. */
  keep: number[];
  /** The skipped groups' reasons. */
  skipped: string[];
}

type Stats = Awaited<ReturnType<Model['trainStep']>>;

/**
 * The options with what the caller left out taken from the schema's defaults, through the same
 * mapping as a config's (pgSettings, optimizerOptions).
 */
function resolved(o: PgOptions) {
  const p = { ...optimizerOptions(sectionDefaults('optim')), ...pgSettings(sectionDefaults('algorithm')), ...stripUndefined(o) };
  return { ...p, oldFromForward: p.oldLogprobs === 'forward', checkpoint: p.gradientCheckpointing };
}

/**
 * A group-baseline policy-gradient algorithm: per-group advantages from `rule` (one scalar per
 * episode), spread over the episode's trained tokens, then `innerEpochs` clipped policy-gradient
 * steps. `name` is the metrics rows' stage.
 */
export function groupPolicyGradient<Q>(
  name: string,
  rule: GroupAdvantageFn,
  opts: PgOptions,
): RlAlgorithm<Q, GroupStep, Stats | undefined, { kept: number[]; skipped: string[] }> {
  const p = resolved(opts);
  const kl = klProblem({ name, kl: PG_KL }, 'loss', p.klEstimator, p.klCoef);
  if (kl) throw new SlmError('CONFIG_INVALID', `${kl.message}.`, { path: kl.path.join('.') });
  return {
    name,
    groupSize: opts.k,
    async advantages(step) {
      const g = grpoAdvantages(
        step.rewards.map((r) => r.total),
        opts.k,
        rule,
        step.rewards.map((r) => r.correct),
        step.rewards.map((r) => r.excluded === true),
      );
      const adv = g.advantages;
      const keep = step.episodes
        .map((_, i) => i)
        .filter((i) => adv[i] !== null && adv[i] !== 0 && step.episodes[i].lossMask.some((x) => x));
      return { adv, keep, skipped: g.skipped.map((x) => x.reason) };
    },
    trained: (a) => a.keep.length,
    async update(rlStep, groupStep) {
      // Every rank takes part in every step's collectives, with or without episodes of its own.
      if (!groupStep.keep.length && !rlStep.shard) return undefined;
      const lr = stageLearningRate(opts.schedule, opts.steps, rlStep.step);
      let stats: Stats | undefined;
      const masks = groupStep.keep.map((i) => rlStep.episodes[i].lossMask);
      // loss_norm 'turn' weighs a token by the global batch's counts: ranks add theirs up.
      let totals: TurnCounts | undefined;
      if (rlStep.shard && p.lossNorm === 'turn') {
        const all = await rlStep.shard.allGather(turnCounts(masks));
        totals = { sequences: all.reduce((x, c) => x + c.sequences, 0), pairs: all.reduce((x, c) => x + c.pairs, 0) };
      }
      const batch = {
        sequences: groupStep.keep.map((i) => rlStep.episodes[i].ids),
        masks,
        advantages: episodeTokenAdvantages(
          groupStep.keep.map((i) => groupStep.adv[i] as number),
          masks,
          { turnDiscount: p.turnDiscount, norm: p.lossNorm, totals },
        ),
        oldLogprobs: groupStep.keep.map((i) => rlStep.episodes[i].logprobs),
        // loss_norm 'turn': the entropy bonus per turn too (its advantages carry the same factor).
        entropyScale: p.lossNorm === 'turn' && p.entropyCoef > 0 ? turnScale(masks, totals) : undefined,
        temperature: groupStep.keep.map((i) => rlStep.episodes[i].lossTemperature ?? rlStep.episodes[i].temperature),
      };
      for (let e = 0; e < p.innerEpochs; e++) {
        stats = await rlStep.model.trainStep(batch, {
          loss: 'pg',
          seed: opts.seed * 1000003 + rlStep.step * 31 + e,
          lr,
          clipLow: p.clipLow,
          clipHigh: p.clipHigh,
          klCoef: p.klCoef,
          klEstimator: p.klEstimator,
          entropyCoef: p.entropyCoef,
          oldFromForward: p.oldFromForward,
          tokenLevel: p.lossNorm === 'token',
          weightDecay: p.weightDecay,
          maxGradNorm: p.maxGradNorm,
          ...p.adam,
          microBatch: p.microBatch,
          checkpoint: p.checkpoint,
        });
      }
      return stats;
    },
    trajectory: (_s, a, i) => ({ advantage: a.adv[i] }),
    share: (_s, a) => ({ kept: a.keep.map((i) => a.adv[i] as number), skipped: a.skipped }),
    row(rlStep, _a, stats, all) {
      const kept = all.shared.flatMap((x) => x.kept);
      const skipped = all.shared.flatMap((x) => x.skipped);
      return {
        head: { lr: stageLearningRate(opts.schedule, opts.steps, rlStep.step) },
        body: {
          episodes_trained: kept.length,
          episodes_excluded: all.rewards.filter((r) => r.excluded === true).length || undefined,
          groups_skipped: skipped.length,
          skip_reasons: skipped.length ? [...new Set(skipped)] : undefined,
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
        },
      };
    },
  };
}

/** The group baselines' KL: in the loss, k3 only. */
export const PG_KL = { defaultIn: 'loss', loss: ['k3'] } as const;

/** GRPO over real episodes (the group rule: deps.advantages). */
export async function runGrpo<Q>(
  model: Model,
  questions: Q[],
  run: RunFolder,
  deps: GrpoDeps<Q>,
  o: GrpoOptions,
): Promise<{ steps: number; meanReward: number[] }> {
  return runRl(model, questions, run, deps, groupPolicyGradient<Q>('grpo', deps.advantages, o), o);
}

/** GRPO in the registry (lib/train/rl/registry.ts): its keys of the algorithm section are the group rule's. */
export const grpo: AlgorithmDefinition = {
  name: 'grpo',
  summary:
    "GRPO: each rollout's advantage is its reward against its group's (one question's K rollouts) mean and std, with the reference's fallbacks; a clipped policy-gradient update",
  algorithmKeys: {
    std: oneOf(['group', 'none'], 'group', 'none = Dr.GRPO (no std division)'),
    std_estimator: oneOf(['sample', 'population'], 'sample', 'sample = divide by K - 1 (TRL, verl)'),
    adv_eps: num(1e-4, { minimum: 0 }),
    fallbacks: section({
      flat_std: num(0.01, { minimum: 0 }, 'a group whose reward std is below this is flat (the reference: 0.01)'),
      flat_skip_below: num(
        0.1,
        {},
        'a flat group whose mean reward is below this is skipped (every rollout failed alike; the reference: 0.1)',
      ),
      zero_variance: oneOf(
        ['center', 'skip', 'zero'],
        'center',
        'a flat group at or above flat_skip_below: center = r - center (the reference), skip, or zero advantages',
      ),
      center: num(0.5),
      all_failed: oneOf(
        ['skip', 'normalize'],
        'normalize',
        'a group with no success but a spread of rewards: normalize (the reference: it learns from the better wrong answers) or skip',
      ),
      fail_by: oneOf(
        ['reward', 'correct'],
        'reward',
        'what a success is for all_failed: skip (reward > fail_at_or_below, or the correctness flag)',
      ),
      fail_at_or_below: num(0, {}, 'with fail_by: reward, a rollout fails when its reward is <= this'),
    }),
  },
  minGroupSize: 2,
  groupReason: 'GRPO compares the rollouts of a group',
  groupBaseline: true,
  lossNorms: ['token', 'sequence', 'turn'],
  kl: PG_KL,
  train(r) {
    const o: GrpoOptions = { ...r.loop, ...pgOptionsFrom(r.cfg) };
    return runRl(r.model, r.questions, r.run, r.deps, groupPolicyGradient('grpo', configuredGroupAdvantages(r.cfg), o), o);
  },
};
