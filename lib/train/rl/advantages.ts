/**
 * Group advantages, as pure functions over plain arrays (no engine, no I/O). Every per-token array is
 * aligned with the episode's token ids, like the loss mask and the log-probs the native trainer takes:
 * index t is about token ids[t] (predicted from ids[<t]).
 *
 * GRPO (group-relative, one group = one question's K rollouts):
 *   A_i = (r_i - mean(r)) / (std(r) + eps)
 *   - std is the *sample* standard deviation by default (Bessel-corrected, divide by K - 1): what TRL's
 *     GRPOTrainer and verl's compute_grpo_outcome_advantage compute (`torch.std`, unbiased=True).
 *     `stdEstimator: 'population'` divides by K (numpy's `np.std` default).
 *   - eps defaults to 1e-4, TRL's value (verl uses 1e-6).
 *   - Dr.GRPO (`std: 'none'`): A_i = r_i - mean(r), no division (Liu et al. 2025).
 *   The reference project's fallbacks (its compute_grpo_advantages, population std), in this order:
 *   1. a group with a non-finite reward (NaN from a failed judge call) is skipped with reason
 *      'non_finite_reward' rather than trained on a guessed value;
 *   2. a flat group (std < `flatStd`, 0.01) whose mean is below `flatSkipBelow` (0.1) is skipped
 *      (reason 'all_failed': every rollout failed alike, there is nothing to learn from);
 *   3. a flat group at or above it: A_i = r_i - center (center 0.5), so an all-correct group still
 *      gets a push up ('zeroVariance: center'; 'skip' and 'zero' are the alternatives);
 *   4. otherwise the formula above — also for a group in which every rollout failed but whose
 *      rewards differ (the reference learns from a better approach among wrong answers).
 *   Opt-in, not the reference: `allFailed: 'skip'` skips every group without a success whatever
 *   its spread (a success: the correctness flag when given, else reward > `failAtOrBelow`).
 *
 * Token level: an episode's scalar advantage is spread over its trained tokens
 * (`episodeTokenAdvantages`, with the turn discount and loss_norm 'turn' weights). DAPO's token-level
 * normalisation is not done here: it is the native loss's `tokenLevel` flag (native/core/train.cc):
 * with it every trained token of the batch weighs 1 / (trained tokens in the batch); without it each
 * sequence's tokens weigh 1 / (sequences x its own trained tokens) (GRPO's per-sequence mean).
 *
 * PPO's token rewards, GAE and whitening are in lib/train/rl/gae.ts.
 */
import { SlmError, describe } from '../../errors.js';
import type { GroupAdvantageFn } from '../types.js';

// ---------------------------------------------------------------------------------------------
// GRPO

export interface GroupAdvantageOptions {
  /** 'group' divides by the group's std (GRPO); 'none' does not (Dr.GRPO). */
  std: 'group' | 'none';
  /** 'sample' (divide by K - 1: TRL, verl) or 'population' (divide by K). */
  stdEstimator: 'sample' | 'population';
  /** Added to the std before dividing. */
  eps: number;
  /** A group whose std (under stdEstimator) is below this is flat (the reference: 0.01). */
  flatStd: number;
  /** A flat group whose mean is below this is skipped (the reference: 0.1). */
  flatSkipBelow: number;
  /** A flat group at or above flatSkipBelow: 'center' (r - center, reference), 'skip', or 'zero'. */
  zeroVariance: 'center' | 'skip' | 'zero';
  /** The constant subtracted by zeroVariance 'center'. */
  center: number;
  /** Without success flags, a rollout fails when its reward is <= this (for allFailed 'skip'). */
  failAtOrBelow: number;
  /** A group without a success: 'normalize' (the formula; reference) or 'skip' whatever its spread. */
  allFailed: 'skip' | 'normalize';
}

const GROUP_ADVANTAGE_DEFAULTS: GroupAdvantageOptions = {
  std: 'group',
  stdEstimator: 'sample',
  eps: 1e-4,
  flatStd: 0.01,
  flatSkipBelow: 0.1,
  zeroVariance: 'center',
  center: 0.5,
  failAtOrBelow: 0,
  allFailed: 'normalize',
};

export type GroupRule = 'normalized' | 'centered' | 'zero' | 'skipped';
export type SkipReason = 'all_failed' | 'zero_variance' | 'non_finite_reward';

export interface GroupAdvantage {
  /** One advantage per rollout, or null when the group is skipped. */
  advantages: number[] | null;
  rule: GroupRule;
  reason?: SkipReason;
  mean: number;
  /** The std under the chosen estimator (0 for a single rollout with the sample estimator). */
  std: number;
  /** Rollouts that did not fail. */
  successes: number;
}

function options(groupAdvantageOptions?: Partial<GroupAdvantageOptions>): GroupAdvantageOptions {
  const opts = { ...GROUP_ADVANTAGE_DEFAULTS, ...groupAdvantageOptions };
  if (opts.std !== 'group' && opts.std !== 'none')
    throw new SlmError('ARGUMENT_INVALID', `std must be "group" or "none", found ${describe(opts.std)}.`);
  if (opts.stdEstimator !== 'sample' && opts.stdEstimator !== 'population')
    throw new SlmError('ARGUMENT_INVALID', `stdEstimator must be "sample" or "population", found ${describe(opts.stdEstimator)}.`);
  if (!(opts.eps >= 0)) throw new SlmError('ARGUMENT_INVALID', `eps must be a number >= 0, found ${describe(opts.eps)}.`);
  if (!(opts.flatStd >= 0)) throw new SlmError('ARGUMENT_INVALID', `flatStd must be a number >= 0, found ${describe(opts.flatStd)}.`);
  if (typeof opts.flatSkipBelow !== 'number' || Number.isNaN(opts.flatSkipBelow))
    throw new SlmError('ARGUMENT_INVALID', `flatSkipBelow must be a number, found ${describe(opts.flatSkipBelow)}.`);
  return opts;
}

/**
 * One group's advantages (one question's K rollouts). `success`, when given, decides which rollouts
 * failed (e.g. the reward's correctness flag); otherwise reward <= failAtOrBelow is a failure.
 */
export function groupAdvantage(
  rewards: ArrayLike<number>,
  opts?: Partial<GroupAdvantageOptions>,
  success?: ArrayLike<boolean>,
): GroupAdvantage {
  const o = options(opts);
  const r = Array.from(rewards);
  const K = r.length;
  if (K === 0) throw new SlmError('ARGUMENT_INVALID', 'a group needs at least one reward, found none.');
  if (success && success.length !== K)
    throw new SlmError('ARGUMENT_INVALID', `success flags must match the rewards: ${K} rewards, ${success.length} flags.`);
  if (r.some((x) => !Number.isFinite(x)))
    return { advantages: null, rule: 'skipped', reason: 'non_finite_reward', mean: NaN, std: NaN, successes: 0 };
  const mean = r.reduce((a, b) => a + b, 0) / K;
  const ss = r.reduce((a, b) => a + (b - mean) ** 2, 0);
  const denom = o.stdEstimator === 'sample' ? K - 1 : K;
  const std = denom > 0 ? Math.sqrt(ss / denom) : 0;
  const successes = success ? Array.from(success).filter(Boolean).length : r.filter((x) => x > o.failAtOrBelow).length;
  const base = { mean, std, successes };
  if (successes === 0 && o.allFailed === 'skip') return { ...base, advantages: null, rule: 'skipped', reason: 'all_failed' };
  // Flat: the std under the estimator in use, or for a single rollout (no sample std) no spread.
  const flat = denom > 0 ? std < o.flatStd : true;
  if (flat) {
    if (mean < o.flatSkipBelow) return { ...base, advantages: null, rule: 'skipped', reason: 'all_failed' };
    if (o.zeroVariance === 'center') return { ...base, advantages: r.map((x) => x - o.center), rule: 'centered' };
    if (o.zeroVariance === 'skip') return { ...base, advantages: null, rule: 'skipped', reason: 'zero_variance' };
    return { ...base, advantages: r.map(() => 0), rule: 'zero' };
  }
  const scale = o.std === 'group' ? 1 / (std + o.eps) : 1;
  return { ...base, advantages: r.map((x) => (x - mean) * scale), rule: 'normalized' };
}

export interface GroupAdvantages {
  /** One per episode, in input order; null = dropped (its group was skipped, or the episode excluded). */
  advantages: Array<number | null>;
  /** Per group: where it starts, its size, and what the rule said of it (groupAdvantage's details with options). */
  groups: Array<{ group: number; start: number; size: number; reason?: string } & Partial<Omit<GroupAdvantage, 'advantages' | 'reason'>>>;
  /** The groups without advantages, and why. */
  skipped: Array<{ group: number; reason: string }>;
}

/**
 * Advantages of a batch laid out group after group: episodes [g*K, (g+1)*K) are group g's K rollouts.
 * `rule`: GRPO's groupAdvantage with these options, or any per-group function (RLOO's, a test's).
 * `success` (e.g. the rewards' correctness flags): a group gets flags when any of its members has
 * one, a member without one counting as not successful. `excluded` members (reward.on_failure:
 * exclude) are left out of their group's statistics and get no advantage; a group with none left is
 * skipped ('all_excluded'). A group is skipped when the rule gives no advantages (its reason, else
 * 'skipped').
 */
export function grpoAdvantages(
  rewards: ArrayLike<number>,
  groupSize: number,
  rule: Partial<GroupAdvantageOptions> | GroupAdvantageFn = {},
  success?: ArrayLike<boolean | undefined>,
  excluded?: ArrayLike<boolean>,
): GroupAdvantages {
  if (!Number.isInteger(groupSize) || groupSize < 1)
    throw new SlmError('ARGUMENT_INVALID', `groupSize must be a positive integer, found ${describe(groupSize)}.`);
  if (rewards.length % groupSize !== 0)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `${rewards.length} rewards do not split into groups of ${groupSize}: expected a multiple of ${groupSize}.`,
    );
  for (const [name, xs] of [
    ['success flags', success],
    ['exclusion flags', excluded],
  ] as const)
    if (xs && xs.length !== rewards.length)
      throw new SlmError('ARGUMENT_INVALID', `${name} must match the rewards: ${rewards.length} rewards, ${xs.length} flags.`);
  let perGroup: (r: number[], s?: boolean[]) => { advantages: number[] | null; reason?: string };
  if (typeof rule === 'function') perGroup = rule;
  else {
    const o = options(rule);
    perGroup = (r, s) => groupAdvantage(r, o, s);
  }
  const out: GroupAdvantages = { advantages: [], groups: [], skipped: [] };
  for (let g = 0, start = 0; start < rewards.length; g++, start += groupSize) {
    const members = Array.from({ length: groupSize }, (_, j) => start + j).filter((i) => excluded?.[i] !== true);
    const flags = success && members.some((i) => typeof success[i] === 'boolean') ? members.map((i) => success[i] === true) : undefined;
    const { advantages, ...info } = members.length
      ? perGroup(
          members.map((i) => rewards[i]),
          flags,
        )
      : { advantages: null, reason: 'all_excluded' };
    const byMember = new Map(members.map((i, n) => [i, advantages ? advantages[n] : null]));
    for (let i = start; i < start + groupSize; i++) out.advantages.push(byMember.get(i) ?? null);
    const reason = advantages ? info.reason : (info.reason ?? 'skipped');
    out.groups.push({ group: g, start, size: groupSize, ...info, ...(reason !== undefined ? { reason } : {}) });
    if (!advantages) out.skipped.push({ group: g, reason: reason! });
  }
  return out;
}

/** The per-group function GRPO takes (a `GroupAdvantageFn`), bound to options. */
export function groupAdvantageFn(opts?: Partial<GroupAdvantageOptions>): GroupAdvantageFn {
  const o = options(opts);
  return (rewards, success) => {
    const g = groupAdvantage(rewards, o, success);
    return g.reason ? { advantages: g.advantages, reason: g.reason } : { advantages: g.advantages };
  };
}

// ---------------------------------------------------------------------------------------------
// Token level

/** An episode's assistant turns: the maximal runs of trained tokens (mask 1), as [start, end) spans. */
export function turnSpans(mask: ArrayLike<number>): Array<[number, number]> {
  const spans: Array<[number, number]> = [];
  for (let t = 0; t < mask.length; t++) {
    if (!mask[t]) continue;
    const start = t;
    while (t < mask.length && mask[t]) t++;
    spans.push([start, t]);
  }
  return spans;
}

const maskTurns = (m: Uint8Array) => turnSpans(Array.from(m, (x, t) => (t === 0 ? 0 : x)));

/** Episodes with trained tokens (S) and (episode, turn) pairs (P) of a batch, for loss_norm 'turn'. */
export interface TurnCounts {
  sequences: number;
  pairs: number;
}
export function turnCounts(masks: readonly Uint8Array[]): TurnCounts {
  const spans = masks.map(maskTurns);
  return { sequences: spans.filter((s) => s.length).length, pairs: spans.reduce((a, s) => a + s.length, 0) };
}

/** How the policy loss averages over a batch (algorithm.loss_norm). */
export type LossNorm = 'token' | 'sequence' | 'turn';

/**
 * Per-token advantages of a batch of episodes for the native policy loss, whose per-token weights
 * are 1 / (trained tokens of the batch) with tokenLevel (loss_norm 'token') and 1 / (S * n_i)
 * otherwise (S episodes with trained tokens, n_i of them in episode i):
 * - `turnDiscount` g: the tokens of turn j of an episode with J turns carry A * g^(J - 1 - j) (the
 *   reference discounts earlier turns, 0.99; 1 = none);
 * - loss_norm 'turn' (the reference: the mean token loss of each (episode, turn) pair, averaged over
 *   the batch's P pairs, so a token of turn j weighs 1 / (P * m_ij)): the factor S * n_i / (P * m_ij)
 *   is folded into the advantage, exact for the clipped objective since min(r A c, clip(r) A c) =
 *   c min(r A, clip(r) A) for c > 0; the native loss then runs per-sequence (tokenLevel false).
 * Token 0 is never a target (nothing predicts it), so it counts in no turn.
 */
export function episodeTokenAdvantages(
  advantages: readonly number[],
  masks: readonly Uint8Array[],
  opts: { turnDiscount?: number; norm?: LossNorm; totals?: TurnCounts } = {},
): Float32Array[] {
  if (advantages.length !== masks.length)
    throw new SlmError('ARGUMENT_INVALID', `${advantages.length} advantages for ${masks.length} loss masks: expected one per episode.`);
  const g = opts.turnDiscount ?? 1;
  if (!(g >= 0 && g <= 1)) throw new SlmError('ARGUMENT_INVALID', `turnDiscount must be in [0, 1], found ${describe(opts.turnDiscount)}.`);
  const norm = opts.norm ?? 'token';
  const spans = masks.map(maskTurns);
  // S and P of the whole batch: this process's, or (data-parallel ranks) the sums over every rank's.
  const { sequences: S, pairs: P } = opts.totals ?? turnCounts(masks);
  return masks.map((mask, i) => {
    const out = new Float32Array(mask.length);
    const turns = spans[i];
    const n = turns.reduce((a, [b, e]) => a + e - b, 0);
    turns.forEach(([b, e], j) => {
      const scale = g ** (turns.length - 1 - j) * (norm === 'turn' ? (S * n) / (P * (e - b)) : 1);
      for (let t = b; t < e; t++) out[t] = advantages[i] * scale;
    });
    return out;
  });
}

/**
 * loss_norm 'turn''s factor S * n_i / (P * m_ij) on each token of turn j of episode i (0 off the
 * turns), which turns the native per-sequence weight 1 / (S * n_i) into 1 / (P * m_ij): the entropy
 * bonus then averages per turn and over the batch's turns, as the reference code-search system's
 * (a turn's mean entropy, P:513-530). The policy loss takes the same factor inside its advantages.
 */
export function turnScale(masks: readonly Uint8Array[], totals?: TurnCounts): Float32Array[] {
  const { sequences: S, pairs: P } = totals ?? turnCounts(masks);
  return masks.map((mask) => {
    const out = new Float32Array(mask.length);
    const turns = maskTurns(mask);
    const n = turns.reduce((a, [b, e]) => a + e - b, 0);
    for (const [b, e] of turns) out.fill((S * n) / (P * (e - b)), b, e);
    return out;
  });
}
