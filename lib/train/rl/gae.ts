/**
 * PPO advantages, as pure functions over plain arrays (no engine, no I/O), aligned with the episode's
 * token ids like the loss mask and the log-probs (see lib/train/rl/advantages.ts); values[t] is the value
 * of the state before token t.
 *
 * As Search-R1 runs PPO on verl:
 *   - token rewards: -kl_coef * KL_t on every trained token (verl apply_kl_penalty, k1 = logp - ref by
 *     default), plus the episode's score on its last trained token (verl puts the score on the last
 *     response token);
 *   - GAE over the trained tokens only: a masked token (prompt, tool output, retrieved passages) is
 *     skipped in the recursion — its value and reward do not enter, and the next trained token's
 *     value and running advantage carry across it (verl compute_gae_advantage_return with its
 *     response mask);
 *   - returns = advantages + values; masked positions hold 0 in both;
 *   - optional whitening of the advantages over every trained token of the batch (verl masked_whiten:
 *     unbiased variance, (x - mean) / sqrt(var + 1e-8)); returns are computed before whitening.
 */
import { SlmError, describe } from '../../errors.js';

export type KlEstimator = 'k1' | 'k2' | 'k3';

/**
 * Per-token KL estimate between the sampling policy and the reference from their log-probs of the
 * sampled token (verl kl_penalty): k1 = logp - ref ('kl'), k2 = (logp - ref)^2 / 2 ('mse'),
 * k3 = exp(ref - logp) - (ref - logp) - 1 ('low_var_kl', clamped to [-10, 10] as verl does).
 */
export function klEstimate(logp: number, refLogp: number, estimator: KlEstimator = 'k1'): number {
  const d = logp - refLogp;
  if (estimator === 'k1') return d;
  if (estimator === 'k2') return 0.5 * d * d;
  if (estimator === 'k3') return Math.min(10, Math.max(-10, Math.exp(-d) + d - 1));
  throw new SlmError('ARGUMENT_INVALID', `kl estimator must be k1, k2 or k3, found ${describe(estimator)}.`);
}

/**
 * Why k1 is refused as a loss term: on tokens sampled from the policy, k1 = log p - log p_ref has the
 * gradient of log p, whose expectation under the policy is 0 (sum_y p(y) grad log p(y) = grad sum_y
 * p(y) = 0): it pulls nothing toward the reference, only adds noise. verl's KL loss uses k3
 * (low_var_kl); k1 belongs in the reward, where PPO's advantages carry it (Search-R1).
 */
export const K1_LOSS_MESSAGE =
  'k1 as a loss term has zero expected gradient (on tokens sampled from the policy its gradient is that of log p, whose mean under the policy is 0), so it would not pull toward the reference; use k3 in the loss (verl low_var_kl), or k1 in the reward (kl_in: reward, as Search-R1)';

export interface TokenRewardInput {
  /** 1 on trained (model-generated) tokens. */
  mask: Uint8Array;
  /** The episode's final reward (score). */
  score: number;
  /** Log-probs of the sampled tokens under the policy that sampled them, aligned with the ids. */
  logprobs?: Float32Array;
  /** Log-probs of the same tokens under the reference policy. Needed when klCoef > 0. */
  refLogprobs?: Float32Array;
}

/**
 * Per-token rewards: -klCoef * KL_t on every trained token and the score added on the last trained
 * token. Returns the rewards and the per-token KL (0 on masked tokens). An episode with no trained
 * token gets all zeros (its score has nowhere to go; `lastTrained` is -1).
 */
export function tokenRewards(
  ep: TokenRewardInput,
  klCoef = 0,
  estimator: KlEstimator = 'k1',
): { rewards: Float32Array; kl: Float32Array; lastTrained: number } {
  const n = ep.mask.length;
  const rewards = new Float32Array(n);
  const kl = new Float32Array(n);
  if (klCoef !== 0) {
    if (!ep.logprobs || !ep.refLogprobs)
      throw new SlmError('ARGUMENT_INVALID', `a KL penalty (kl_coef ${klCoef}) needs logprobs and refLogprobs for every episode.`);
    if (ep.logprobs.length !== n || ep.refLogprobs.length !== n)
      throw new SlmError(
        'ARGUMENT_INVALID',
        `logprobs (${ep.logprobs.length}) and refLogprobs (${ep.refLogprobs.length}) must align with the mask (${n} tokens).`,
      );
  }
  let last = -1;
  for (let t = 0; t < n; t++) {
    if (!ep.mask[t]) continue;
    last = t;
    if (klCoef !== 0) {
      kl[t] = klEstimate(ep.logprobs![t], ep.refLogprobs![t], estimator);
      rewards[t] = -klCoef * kl[t];
    }
  }
  if (last >= 0) rewards[last] += ep.score;
  return { rewards, kl, lastTrained: last };
}

/**
 * Generalised advantage estimation over the trained tokens of one episode (masked tokens skipped):
 *   delta_t = r_t + gamma * V_next - V_t,  A_t = delta_t + gamma * lam * A_next
 * where "next" is the next *trained* token (V_next = 0 and A_next = 0 after the last one).
 * returns_t = A_t + V_t. Masked positions hold 0.
 */
export function gae(
  rewards: Float32Array,
  values: Float32Array,
  mask: Uint8Array,
  gamma: number,
  lam: number,
): { advantages: Float32Array; returns: Float32Array } {
  const n = mask.length;
  if (rewards.length !== n || values.length !== n)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `rewards (${rewards.length}), values (${values.length}) and mask (${n}) must have one entry per token.`,
    );
  const advantages = new Float32Array(n);
  const returns = new Float32Array(n);
  // Accumulate in float64, store float32.
  let nextValue = 0;
  let nextAdv = 0;
  for (let t = n - 1; t >= 0; t--) {
    if (!mask[t]) continue;
    const delta = rewards[t] + gamma * nextValue - values[t];
    const a = delta + gamma * lam * nextAdv;
    advantages[t] = a;
    returns[t] = a + values[t];
    nextValue = values[t];
    nextAdv = a;
  }
  return { advantages, returns };
}

/**
 * verl masked_whiten over a batch: mean and unbiased variance over every masked-in entry of every
 * array, then (x - mean) / sqrt(var + eps) (plus the mean back when shiftMean is false). Masked-out
 * entries stay 0. Fewer than two trained tokens: returned unchanged (no variance to speak of).
 */
export function maskedWhiten(xs: Float32Array[], masks: Uint8Array[], opts: { shiftMean?: boolean; eps?: number } = {}): Float32Array[] {
  if (xs.length !== masks.length)
    throw new SlmError('ARGUMENT_INVALID', `${xs.length} arrays for ${masks.length} masks: expected one mask per array.`);
  let n = 0;
  let sum = 0;
  xs.forEach((x, i) => {
    if (x.length !== masks[i].length)
      throw new SlmError('ARGUMENT_INVALID', `array ${i} has ${x.length} entries but its mask ${masks[i].length}.`);
    for (let t = 0; t < x.length; t++)
      if (masks[i][t]) {
        n++;
        sum += x[t];
      }
  });
  if (n < 2) return xs.map((x) => Float32Array.from(x));
  const mean = sum / n;
  let ss = 0;
  xs.forEach((x, i) => {
    for (let t = 0; t < x.length; t++) if (masks[i][t]) ss += (x[t] - mean) ** 2;
  });
  const inv = 1 / Math.sqrt(ss / (n - 1) + (opts.eps ?? 1e-8));
  const back = opts.shiftMean === false ? mean : 0;
  return xs.map((x, i) => {
    const out = new Float32Array(x.length);
    for (let t = 0; t < x.length; t++) if (masks[i][t]) out[t] = (x[t] - mean) * inv + back;
    return out;
  });
}

export interface PpoEpisodeInput extends TokenRewardInput {
  /** Value-head outputs aligned with the ids (value of the state before each token). */
  values: Float32Array;
}

export interface PpoAdvantageOptions {
  gamma: number;
  lam: number;
  klCoef: number;
  klEstimator: KlEstimator;
  /** Whiten advantages over the batch's trained tokens (verl always does). */
  whiten: boolean;
}

const PPO_ADVANTAGE_DEFAULTS: PpoAdvantageOptions = { gamma: 1, lam: 1, klCoef: 0.001, klEstimator: 'k1', whiten: true };

export interface PpoAdvantages {
  advantages: Float32Array[];
  returns: Float32Array[];
  /** The token rewards GAE ran on (score + KL penalty). */
  rewards: Float32Array[];
  /** Mean KL estimate over the trained tokens of the batch (0 when there are none). */
  klMean: number;
  /** Episodes with no trained token (their score went nowhere). */
  empty: number[];
}

/** Token rewards, GAE and (optionally) whitening for a batch of PPO episodes. */
export function ppoAdvantages(episodes: PpoEpisodeInput[], opts?: Partial<PpoAdvantageOptions>): PpoAdvantages {
  const o = { ...PPO_ADVANTAGE_DEFAULTS, ...opts };
  if (!(o.gamma >= 0 && o.gamma <= 1) || !(o.lam >= 0 && o.lam <= 1))
    throw new SlmError('ARGUMENT_INVALID', `gamma and lam must be in [0, 1], found gamma ${describe(o.gamma)} and lam ${describe(o.lam)}.`);
  const rewards: Float32Array[] = [];
  const advantages: Float32Array[] = [];
  const returns: Float32Array[] = [];
  const empty: number[] = [];
  let klSum = 0;
  let klN = 0;
  episodes.forEach((ep, i) => {
    const tr = tokenRewards(ep, o.klCoef, o.klEstimator);
    if (tr.lastTrained < 0) empty.push(i);
    for (let t = 0; t < ep.mask.length; t++)
      if (ep.mask[t]) {
        klSum += tr.kl[t];
        klN++;
      }
    const g = gae(tr.rewards, ep.values, ep.mask, o.gamma, o.lam);
    rewards.push(tr.rewards);
    advantages.push(g.advantages);
    returns.push(g.returns);
  });
  return {
    advantages: o.whiten
      ? maskedWhiten(
          advantages,
          episodes.map((e) => e.mask),
        )
      : advantages,
    returns,
    rewards,
    klMean: klN ? klSum / klN : 0,
    empty,
  };
}
