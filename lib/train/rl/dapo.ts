/**
 * Two of DAPO's remedies (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
 * Scale"), as pure functions over a step's episodes and rewards; the RL loop (lib/train/rl/rl-loop.ts)
 * applies them:
 *   - over-long responses: truncated episodes left out of the loss (overlong filtering), and the soft
 *     over-length penalty: the last `buffer` tokens before the length limit are a buffer, a response
 *     that runs x tokens into it scores -penaltyFactor * x / buffer more (verl's DAPO reward manager:
 *     min(-(length - (max - buffer)) / buffer * penalty_factor, 0));
 *   - dynamic sampling: groups whose rewards are all equal carry no gradient; the loop drops them and
 *     draws more questions, a bounded number of times.
 * In a multi-turn episode the length limit is per turn (protocol.max_new_tokens), so the penalty
 * measures the episode's longest turn: the sampled tokens of that turn, the ones the limit counts.
 */
import { SlmError, describe } from '../../errors.js';
import type { ResolvedConfig } from '../../config/types.js';
import type { RewardResult, TrainEpisode } from '../types.js';

export interface OverlongOptions {
  /** Leave truncated episodes out of the loss (marked excluded). */
  filter: boolean;
  /** Tokens before maxNewTokens where the soft penalty grows; 0 = no penalty. */
  buffer: number;
  /** The penalty at the limit. */
  penaltyFactor: number;
  /** The per-turn limit (protocol.max_new_tokens). */
  maxNewTokens: number;
}

/** What a step's turn records say about an episode's length (its record.steps and record.finish). */
export interface EpisodeLength {
  /** A turn stopped at the token limit, or the conversation at the context limit. */
  truncated: boolean;
  /** Sampled tokens of the longest turn (kept + sampled after the action and dropped). */
  longestTurn: number;
}

interface StepLike {
  finishReason?: string;
  generatedTokens?: number;
  droppedTokens?: number;
}

/** The length facts of an episode, from the turn records the runner keeps in `record`. */
export function episodeLength(ep: Pick<TrainEpisode, 'record'>): EpisodeLength {
  const steps = (Array.isArray(ep.record?.steps) ? ep.record.steps : []) as StepLike[];
  const longestTurn = steps.reduce((m, s) => Math.max(m, (s.generatedTokens ?? 0) + (s.droppedTokens ?? 0)), 0);
  const truncated = ep.record?.finish === 'context' || steps.some((s) => s.finishReason === 'length');
  return { truncated, longestTurn };
}

/**
 * DAPO's soft over-length penalty of a response of `length` tokens under a limit of `maxLength` with
 * a buffer of `buffer` tokens: 0 up to maxLength - buffer, then linear down to -penaltyFactor at
 * maxLength (and no lower: a response is never longer than the limit). buffer 0: no penalty.
 */
export function overlongPenalty(length: number, maxLength: number, buffer: number, penaltyFactor: number): number {
  if (!(buffer > 0)) return 0;
  if (buffer > maxLength)
    throw new SlmError('ARGUMENT_INVALID', `the over-length buffer (${buffer}) must not exceed the length limit (${maxLength}).`);
  const exceed = Math.min(length - (maxLength - buffer), buffer);
  return exceed > 0 ? (-exceed / buffer) * penaltyFactor : 0;
}

/**
 * The step's rewards with the over-long rules applied: the soft penalty added to `total` (and kept
 * as the part `overlong_penalty`), truncated episodes marked excluded with `filter`. Counts what it
 * did. Rewards are copied, never changed in place.
 */
export function shapeOverlong(
  episodes: readonly TrainEpisode[],
  rewards: readonly RewardResult[],
  opts: OverlongOptions,
): { rewards: RewardResult[]; truncated: number; filtered: number; penalized: number } {
  if (episodes.length !== rewards.length)
    throw new SlmError('ARGUMENT_INVALID', `shapeOverlong: ${episodes.length} episodes but ${rewards.length} rewards.`);
  let truncated = 0;
  let filtered = 0;
  let penalized = 0;
  const out = rewards.map((result, i) => {
    const len = episodeLength(episodes[i]);
    if (len.truncated) truncated++;
    const p = overlongPenalty(len.longestTurn, opts.maxNewTokens, opts.buffer, opts.penaltyFactor);
    let next = result;
    if (p !== 0) {
      penalized++;
      next = { ...next, total: next.total + p, parts: { ...next.parts, overlong_penalty: p } };
    }
    if (opts.filter && len.truncated) {
      if (next.excluded !== true) filtered++;
      next = { ...next, excluded: true };
    }
    return next;
  });
  return { rewards: out, truncated, filtered, penalized };
}

/**
 * Per group of `k` consecutive rewards: whether its members left in (not excluded) have a spread of
 * rewards (max > min), i.e. whether group-relative advantages can be other than 0.
 */
export function groupsWithSpread(rewards: readonly RewardResult[], k: number): boolean[] {
  if (!Number.isInteger(k) || k < 1 || rewards.length % k !== 0)
    throw new SlmError('ARGUMENT_INVALID', `groupsWithSpread: ${rewards.length} rewards do not make groups of ${describe(k)}.`);
  return Array.from({ length: rewards.length / k }, (_, g) => {
    const xs = rewards
      .slice(g * k, (g + 1) * k)
      .filter((r) => r.excluded !== true)
      .map((r) => r.total);
    return xs.length >= 2 && Math.max(...xs) > Math.min(...xs);
  });
}

/** Dynamic sampling as the loop runs it: at most `maxDraws` batches of questions per step. */
export interface DynamicSamplingOptions {
  maxDraws: number;
}

/** The RL loop's DAPO options of a resolved config (none of them when off). */
export function dapoOptionsFrom(cfg: ResolvedConfig): { overlong?: OverlongOptions; dynamicSampling?: DynamicSamplingOptions } {
  const ol = cfg.algorithm.overlong;
  const ds = cfg.rollout.dynamic_sampling;
  return {
    ...(ol.filter || ol.buffer > 0
      ? { overlong: { filter: ol.filter, buffer: ol.buffer, penaltyFactor: ol.penalty_factor, maxNewTokens: cfg.protocol.max_new_tokens } }
      : {}),
    ...(ds.enabled ? { dynamicSampling: { maxDraws: ds.max_draws } } : {}),
  };
}
