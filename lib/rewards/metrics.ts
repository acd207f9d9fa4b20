/**
 * Answer metrics on normalised text (normalize.ts): exact match and substring match as Search-R1's
 * `em_check` / `subem_check`, token F1 as the SQuAD / HotpotQA scripts, ROUGE-L as the LCS
 * F-measure (beta = 1, the `rouge_score` package's rougeL F, but over `normalizeAnswer` tokens
 * instead of rouge_score's own tokenizer and without stemming), and the `<answer>` extraction of
 * Search-R1's `extract_solution`. Every metric takes one gold or a list and scores the best gold.
 * Pure functions: the training rewards (combine.ts) and the evaluation both use them.
 */
import { SlmError, describe } from '../errors.js';
import { answerTokens, normalizeAnswer } from './normalize.js';

/** One gold answer or several (any of them counts). */
export type Golds = string | readonly string[];

function goldList(golds: Golds, what: string): readonly string[] {
  const list = typeof golds === 'string' ? [golds] : golds;
  if (!Array.isArray(list) || list.some((g) => typeof g !== 'string')) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the gold answers for ${what} to be a string or an array of strings, but found ${describe(golds)}.`,
    );
  }
  return list;
}

/** 1 when the normalised prediction equals a normalised gold, else 0 (Search-R1 `em_check`). */
export function exactMatch(prediction: string, golds: Golds): 0 | 1 {
  const p = normalizeAnswer(prediction);
  return goldList(golds, 'exactMatch').some((g) => normalizeAnswer(g) === p) ? 1 : 0;
}

/**
 * 1 when a normalised gold is a substring of the normalised prediction, else 0 (Search-R1
 * `subem_check`). A plain substring, not a token match: gold "paris" matches "parisian".
 */
export function subExactMatch(prediction: string, golds: Golds): 0 | 1 {
  const p = normalizeAnswer(prediction);
  return goldList(golds, 'subExactMatch').some((g) => p.includes(normalizeAnswer(g))) ? 1 : 0;
}

export interface PrecisionRecall {
  f1: number;
  precision: number;
  recall: number;
}

const ZERO: PrecisionRecall = { f1: 0, precision: 0, recall: 0 };
const SPECIAL = new Set(['yes', 'no', 'noanswer']);

/**
 * Token F1 against one gold (HotpotQA `f1_score`): multiset overlap of the normalised tokens. As
 * HotpotQA (and Search-R1's F1): when either side normalises to yes / no / noanswer and the two
 * differ, the score is 0 (no partial credit for "no" against "no way"). No common token (both
 * empty included) gives 0.
 */
export function f1Details(prediction: string, gold: string): PrecisionRecall {
  const np = normalizeAnswer(prediction);
  const ng = normalizeAnswer(gold);
  if ((SPECIAL.has(np) || SPECIAL.has(ng)) && np !== ng) return ZERO;
  const pt = answerTokens(prediction);
  const gt = answerTokens(gold);
  const counts = new Map<string, number>();
  for (const w of gt) counts.set(w, (counts.get(w) ?? 0) + 1);
  let same = 0;
  for (const w of pt) {
    const c = counts.get(w) ?? 0;
    if (c > 0) {
      same++;
      counts.set(w, c - 1);
    }
  }
  if (same === 0) return ZERO;
  const precision = same / pt.length;
  const recall = same / gt.length;
  return { f1: (2 * precision * recall) / (precision + recall), precision, recall };
}

/** Token F1, the best over the golds (0 for an empty gold list). */
export function f1Score(prediction: string, golds: Golds): number {
  return Math.max(0, ...goldList(golds, 'f1Score').map((g) => f1Details(prediction, g).f1));
}

/** Length of the longest common subsequence of two token lists (O(n·m) time, O(m) memory). */
export function lcsLength(a: readonly string[], b: readonly string[]): number {
  const row = new Array<number>(b.length + 1).fill(0);
  for (let i = 1; i <= a.length; i++) {
    let diag = 0; // row[j - 1] of the previous i
    for (let j = 1; j <= b.length; j++) {
      const up = row[j];
      row[j] = a[i - 1] === b[j - 1] ? diag + 1 : Math.max(up, row[j - 1]);
      diag = up;
    }
  }
  return row[b.length];
}

/** ROUGE-L against one gold: P = LCS / |prediction|, R = LCS / |gold|, F = 2PR / (P + R). */
export function rougeLDetails(prediction: string, gold: string): PrecisionRecall {
  const pt = answerTokens(prediction);
  const gt = answerTokens(gold);
  const lcs = lcsLength(pt, gt);
  if (lcs === 0) return ZERO;
  const precision = lcs / pt.length;
  const recall = lcs / gt.length;
  return { f1: (2 * precision * recall) / (precision + recall), precision, recall };
}

/** ROUGE-L F-measure, the best over the golds (0 for an empty gold list). */
export function rougeL(prediction: string, golds: Golds): number {
  return Math.max(0, ...goldList(golds, 'rougeL').map((g) => rougeLDetails(prediction, g).f1));
}

export interface AnswerMetrics {
  em: number;
  subem: number;
  f1: number;
  rouge_l: number;
}

/** Every answer metric at once, for evaluation reports. A missing answer (null) scores 0 on all. */
export function answerMetrics(prediction: string | null, golds: Golds): AnswerMetrics {
  if (prediction === null) return { em: 0, subem: 0, f1: 0, rouge_l: 0 };
  return {
    em: exactMatch(prediction, golds),
    subem: subExactMatch(prediction, golds),
    f1: f1Score(prediction, golds),
    rouge_l: rougeL(prediction, golds),
  };
}

/**
 * Search-R1 passes the prompt and the response as one "solution string"; its instruction contains
 * one example `<answer> Beijing </answer>`, so `extract_solution` returns None unless there are at
 * least two `<answer>` blocks. Use this as `minMatches` to reproduce it on such text.
 */
export const SEARCH_R1_MIN_ANSWER_BLOCKS = 2;

/**
 * The last `<answer>…</answer>` block of `text` (non-greedy, across lines), trimmed; null when there
 * are fewer than `minMatches` blocks (default 1: `text` is the model's output only). The
 * EpisodeRunner already returns the episode's answer; this is for text from elsewhere (SFT data,
 * other trainers' logs).
 */
export function extractAnswer(text: string, opts: { minMatches?: number } = {}): string | null {
  const min = opts.minMatches ?? 1;
  const matches = [...text.matchAll(/<answer>([\s\S]*?)<\/answer>/g)];
  if (matches.length === 0 || matches.length < min) return null;
  return matches[matches.length - 1][1].trim();
}
