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
import { mean } from './rollout-metrics.js';
import { episodeTokenAdvantages, grpoAdvantages, turnCounts, turnScale, type LossNorm, type TurnCounts } from './advantages.js';
import { runRl, stageLearningRate, type RlAlgorithm, type RlLoopOptions, type StageSchedule } from './rl-loop.js';
import { sectionDefaults } from '../../config/schema.js';
import { scheduleSpec } from '../../config/algorithm.js';
import type { ResolvedConfig } from '../../config/types.js';
import { SlmError } from '../../errors.js';
import { K1_LOSS_MESSAGE } from './gae.js';
import type { RunFolder } from '../run.js';
import type { AdamOptions, GroupAdvantageFn, RlDeps } from '../types.js';

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

/**
 * The group-baseline options (GRPO, RLOO) of a resolved config's algorithm, rollout and optim
 * sections; the loop's own options (questions per step, steps, seed...) come from the caller.
 */
export function pgOptionsFrom(c: ResolvedConfig): Pick<PgOptions, 'k' | 'innerEpochs' | 'clipLow' | 'clipHigh' | 'klCoef' | 'klEstimator' | 'entropyCoef' | 'lossNorm' | 'turnDiscount' | 'oldLogprobs' | 'schedule'> {
  const a = c.algorithm;
  if (a.kl_coef > 0 && a.kl_estimator !== 'k3') throw new SlmError('CONFIG_INVALID', `algorithm.kl_estimator: ${c.stage.toUpperCase()} puts the KL in the loss, which takes k3; found ${a.kl_estimator}.${a.kl_estimator === 'k1' ? ` ${K1_LOSS_MESSAGE}.` : ''}`, { path: 'algorithm.kl_estimator' });
  return {
    k: c.rollout.k,
    innerEpochs: a.inner_epochs,
    clipLow: a.clip_low,
    clipHigh: a.clip_high,
    klCoef: a.kl_coef,
    klEstimator: 'k3',
    entropyCoef: a.entropy_coef,
    lossNorm: a.loss_norm,
    turnDiscount: a.turn_discount,
    oldLogprobs: a.old_logprobs,
    schedule: scheduleSpec(c),
  };
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

/** The options with every default filled in from the config schema (lib/config/schema.ts). */
function resolved(o: PgOptions) {
  const a = sectionDefaults('algorithm');
  const opt = sectionDefaults('optim');
  const clipLow = o.clipLow ?? a.clip_low;
  if ((o.klCoef ?? a.kl_coef) > 0 && o.klEstimator === 'k1') throw new SlmError('CONFIG_INVALID', `klEstimator k1 in the loss: ${K1_LOSS_MESSAGE}.`, { path: 'algorithm.kl_estimator' });
  return {
    innerEpochs: o.innerEpochs ?? a.inner_epochs,
    clipLow,
    clipHigh: o.clipHigh ?? clipLow,
    klCoef: o.klCoef ?? a.kl_coef,
    // The KL goes into the loss, whose estimator defaults to k3 (lib/config/load.ts derive).
    klEstimator: o.klEstimator ?? 'k3',
    lossNorm: o.lossNorm ?? a.loss_norm,
    turnDiscount: o.turnDiscount ?? a.turn_discount,
    entropyCoef: o.entropyCoef ?? a.entropy_coef,
    oldFromForward: (o.oldLogprobs ?? a.old_logprobs) === 'forward',
    weightDecay: o.weightDecay ?? opt.weight_decay,
    maxGradNorm: o.maxGradNorm ?? opt.max_grad_norm,
    checkpoint: o.gradientCheckpointing ?? opt.gradient_checkpointing,
  };
}

/**
 * A group-baseline policy-gradient algorithm: per-group advantages from `rule` (one scalar per
 * episode), spread over the episode's trained tokens, then `innerEpochs` clipped policy-gradient
 * steps. `name` is the metrics rows' stage.
 */
export function groupPolicyGradient<Q>(name: string, rule: GroupAdvantageFn, o: PgOptions): RlAlgorithm<Q, GroupStep, Stats | undefined, { kept: number[]; skipped: string[] }> {
  const p = resolved(o);
  return {
    name,
    groupSize: o.k,
    async advantages(s) {
      const g = grpoAdvantages(
        s.rewards.map((r) => r.total),
        o.k,
        rule,
        s.rewards.map((r) => r.correct),
        s.rewards.map((r) => r.excluded === true),
      );
      const adv = g.advantages;
      const keep = s.episodes.map((_, i) => i).filter((i) => adv[i] !== null && adv[i] !== 0 && s.episodes[i].lossMask.some((x) => x));
      return { adv, keep, skipped: g.skipped.map((x) => x.reason) };
    },
    trained: (a) => a.keep.length,
    async update(s, a) {
      // Every rank takes part in every step's collectives, with or without episodes of its own.
      if (!a.keep.length && !s.shard) return undefined;
      const lr = stageLearningRate(o.schedule, o.steps, s.step);
      let stats: Stats | undefined;
      const masks = a.keep.map((i) => s.episodes[i].lossMask);
      // loss_norm 'turn' weighs a token by the global batch's counts: ranks add theirs up.
      let totals: TurnCounts | undefined;
      if (s.shard && p.lossNorm === 'turn') {
        const all = await s.shard.allGather(turnCounts(masks));
        totals = { sequences: all.reduce((x, c) => x + c.sequences, 0), pairs: all.reduce((x, c) => x + c.pairs, 0) };
      }
      const batch = {
        sequences: a.keep.map((i) => s.episodes[i].ids),
        masks,
        advantages: episodeTokenAdvantages(
          a.keep.map((i) => a.adv[i] as number),
          masks,
          { turnDiscount: p.turnDiscount, norm: p.lossNorm, totals },
        ),
        oldLogprobs: a.keep.map((i) => s.episodes[i].logprobs),
        // loss_norm 'turn': the entropy bonus per turn too (its advantages carry the same factor).
        entropyScale: p.lossNorm === 'turn' && p.entropyCoef > 0 ? turnScale(masks, totals) : undefined,
        temperature: a.keep.map((i) => s.episodes[i].lossTemperature ?? s.episodes[i].temperature),
      };
      for (let e = 0; e < p.innerEpochs; e++) {
        stats = await s.model.trainStep(batch, {
          loss: 'pg',
          seed: o.seed * 1000003 + s.step * 31 + e,
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
          ...o.adam,
          microBatch: o.microBatch,
          checkpoint: p.checkpoint,
        });
      }
      return stats;
    },
    trajectory: (_s, a, i) => ({ advantage: a.adv[i] }),
    share: (_s, a) => ({ kept: a.keep.map((i) => a.adv[i] as number), skipped: a.skipped }),
    row(s, _a, stats, all) {
      const kept = all.shared.flatMap((x) => x.kept);
      const skipped = all.shared.flatMap((x) => x.skipped);
      return {
        head: { lr: stageLearningRate(o.schedule, o.steps, s.step) },
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

/** GRPO over real episodes (the group rule: deps.advantages). */
export async function runGrpo<Q>(model: Model, questions: Q[], run: RunFolder, deps: GrpoDeps<Q>, o: GrpoOptions): Promise<{ steps: number; meanReward: number[] }> {
  return runRl(model, questions, run, deps, groupPolicyGradient<Q>('grpo', deps.advantages, o), o);
}
