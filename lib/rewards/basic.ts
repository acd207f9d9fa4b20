/**
 * The rule-based reward components: exact match, substring match, token F1, ROUGE-L (metrics.ts)
 * and the format penalty. Each is a RewardFn with one named value; an episode without an answer
 * scores 0 on every match metric (Search-R1: `extract_solution` gives None -> reward 0).
 */
import { SlmError, describe } from '../errors.js';
import { exactMatch, f1Score, rougeL, subExactMatch } from './metrics.js';
import { normalizeAnswer } from './normalize.js';
import type { RewardContext, RewardFn, RewardParts } from './types.js';

export type MatchMetric = 'em' | 'subem' | 'f1' | 'rouge_l';

const METRICS: Record<MatchMetric, (pred: string, golds: readonly string[]) => number> = {
  em: exactMatch,
  subem: subExactMatch,
  f1: f1Score,
  rouge_l: rougeL,
};

/**
 * A match reward: `{ [name]: metric(answer, golds) }`. em and subem also give `correct` (value 1);
 * f1 and rouge_l give none (partial credit is no verdict).
 */
export function matchReward(metric: MatchMetric, name: string = metric): RewardFn {
  const fn = METRICS[metric];
  if (!fn)
    throw new SlmError('ARGUMENT_INVALID', `Expected a match metric (${Object.keys(METRICS).join(', ')}), but found ${describe(metric)}.`);
  const verdict = metric === 'em' || metric === 'subem';
  return async (ctx: RewardContext): Promise<RewardParts> => {
    const v = ctx.answer === null ? 0 : fn(ctx.answer, ctx.golds);
    return verdict ? { parts: { [name]: v }, correct: v === 1 } : { parts: { [name]: v } };
  };
}

export interface FormatPenaltyOptions {
  /** Penalty when the episode ended without an answer (default 1). */
  noAnswer?: number;
  /** Penalty when the answer is empty after normalisation, e.g. `<answer> . </answer>` (default 1). */
  emptyAnswer?: number;
  /** Answers with more whitespace-separated words than this are overlong (default: no limit). */
  maxWords?: number | null;
  /** Penalty for an overlong answer (default 0.5). */
  overlong?: number;
}

/** Why an answer is penalised, or null when its format is fine. */
function formatProblem(answer: string | null, maxWords: number | null = null): 'no_answer' | 'empty_answer' | 'overlong' | null {
  if (answer === null) return 'no_answer';
  if (normalizeAnswer(answer) === '') return 'empty_answer';
  if (maxWords !== null && answer.trim().split(/\s+/u).length > maxWords) return 'overlong';
  return null;
}

/**
 * The format penalty as a part: `{ [name]: -penalty }` (0 when the format is fine). The three
 * cases exclude each other (no answer, else empty, else overlong), so at most one penalty applies.
 */
export function formatReward(opts: FormatPenaltyOptions = {}, name = 'format'): RewardFn {
  const penalties = { no_answer: opts.noAnswer ?? 1, empty_answer: opts.emptyAnswer ?? 1, overlong: opts.overlong ?? 0.5 };
  const maxWords = opts.maxWords ?? null;
  for (const [k, v] of Object.entries({ ...penalties, maxWords: maxWords ?? 1 })) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
      throw new SlmError('ARGUMENT_INVALID', `Expected the format penalty option ${k} to be a number >= 0, but found ${describe(v)}.`);
    }
  }
  return async (ctx: RewardContext): Promise<RewardParts> => {
    const problem = formatProblem(ctx.answer, maxWords);
    return { parts: { [name]: problem === null ? 0 : 0 - penalties[problem] } };
  };
}
