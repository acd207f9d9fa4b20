/**
 * Reading the LLM judge's replies: the grades of a graded reply (`Correctness: N` / `Approach: N`)
 * and the verdict of a binary one (`{"category": ..., "approach_score": N}`), after any `<think>`
 * block. A reply that cannot be read throws JUDGE_FAILED quoting its end.
 */
import { SlmError, describe } from '../errors.js';
import { binaryJudgeShape, type JudgeFormat } from './judge-prompts.js';

export type JudgeCategory = 'correct' | 'incorrect' | 'gave_up';
const JUDGE_CATEGORIES: readonly JudgeCategory[] = ['correct', 'incorrect', 'gave_up'];

export interface JudgeGrades {
  /** In [0, 1]: graded, the reply's 0-10 grade / 10; binary, 1 for "correct" and 0 otherwise. */
  correctness: number;
  /** In [0, 1], or null when not asked for. */
  approach: number | null;
  /** The binary format's category (absent in the graded format). */
  category?: JudgeCategory;
}

/** The text after the last `</think>` (a reasoning model's verdict comes after its thinking). */
function afterThinking(text: string): string {
  const end = text.lastIndexOf('</think>');
  return end >= 0 ? text.slice(end + '</think>'.length) : text;
}

/** The reply's end, quoted, for messages. */
function quoteTail(reply: string): string {
  return JSON.stringify(reply.length > 200 ? '...' + reply.slice(-200) : reply);
}

/** The last `label: N` in the text (also `**Label:** N/10`, `"label": N`), or undefined. */
function lastGrade(text: string, label: string): string | undefined {
  const re = new RegExp(`\\b${label}\\b["'*\\s]*[:=]?["'*\\s]*(-?\\d+(?:\\.\\d+)?)`, 'gi');
  let found: string | undefined;
  for (const m of text.matchAll(re)) found = m[1];
  return found;
}

/**
 * Read the grades of a graded-format reply. Throws JUDGE_FAILED when a grade is missing or outside
 * 0-10 (the message quotes the reply's end, so the log shows what the judge said).
 */
function parseGradedReply(reply: string, approach = true): JudgeGrades {
  const text = afterThinking(reply);
  const tail = quoteTail(reply);
  const grade = (label: string): number => {
    const raw = lastGrade(text, label);
    if (raw === undefined) {
      throw new SlmError(
        'JUDGE_FAILED',
        `Expected the judge's reply to end with a line "${label[0].toUpperCase() + label.slice(1)}: <0-10>", but found none in ${tail}. Use a stronger judge model, more max tokens, or a system prompt that asks for these lines.`,
      );
    }
    const v = Number(raw);
    if (!(v >= 0 && v <= 10))
      throw new SlmError('JUDGE_FAILED', `Expected the judge's ${label} grade to be from 0 to 10, but found ${raw} in ${tail}.`);
    return v / 10;
  };
  return { correctness: grade('correctness'), approach: approach ? grade('approach') : null };
}

/** Every balanced `{...}` in the text (quotes and escapes respected), in order; nested ones not listed apart. */
function braceObjects(text: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = -1;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (inString) {
      if (ch === '\\') i++;
      else if (ch === '"') inString = false;
    } else if (ch === '"' && depth > 0) inString = true;
    else if (ch === '{') {
      if (depth++ === 0) start = i;
    } else if (ch === '}' && depth > 0) {
      if (--depth === 0) out.push(text.slice(start, i + 1));
    }
  }
  return out;
}

/** A category as the judge may spell it ("Correct", "gave up", "GAVE-UP"), or undefined. */
function categoryOf(v: unknown): JudgeCategory | undefined {
  if (typeof v !== 'string') return undefined;
  const s = v
    .trim()
    .toLowerCase()
    .replace(/[\s-]+/g, '_');
  return (JUDGE_CATEGORIES as readonly string[]).includes(s) ? (s as JudgeCategory) : s === 'gaveup' ? 'gave_up' : undefined;
}

interface RawVerdict {
  category: unknown;
  approach: unknown;
  /** Where the values came from, for messages. */
  source: string;
}

/** The last JSON object of the text that has a category (or the old boolean `correct`). */
function verdictFromJson(text: string): RawVerdict | undefined {
  const objects = braceObjects(text);
  for (let i = objects.length - 1; i >= 0; i--) {
    let o: unknown;
    try {
      o = JSON.parse(objects[i]);
    } catch {
      continue;
    }
    if (typeof o !== 'object' || o === null || Array.isArray(o)) continue;
    const r = o as Record<string, unknown>;
    const category = 'category' in r ? r.category : typeof r.correct === 'boolean' ? (r.correct ? 'correct' : 'incorrect') : undefined;
    if (category === undefined) continue;
    return { category, approach: 'approach_score' in r ? r.approach_score : r.approach, source: objects[i] };
  }
  return undefined;
}

/** Loose `category: correct` / `approach_score: 80` text (not valid JSON), the last of each. */
function verdictFromText(text: string): RawVerdict | undefined {
  let category: string | undefined;
  for (const m of text.matchAll(/\bcategory\b["'*\s]*[:=]["'*\s]*(correct|incorrect|gave[ _-]?up)\b(?!["'\s]*\|)/gi)) category = m[1]; // not the prompt's `"correct" | ...`
  if (category === undefined) return undefined;
  let approach: string | undefined;
  for (const m of text.matchAll(/\bapproach(?:_score)?\b["'*\s]*[:=]["'*\s]*(-?\d+(?:\.\d+)?)/gi)) approach = m[1];
  return { category, approach, source: 'the text' };
}

/**
 * Read the verdict of a binary-format reply: `{"category": ..., "approach_score": N}` after any
 * `<think>` block, in or out of markdown fences. Throws JUDGE_FAILED, quoting the reply's end, when
 * there is no category, the category is not one of the three, or the approach score is missing or
 * not a number (when asked for). An approach score outside 0-100 is clamped (the reference does).
 * `missingApproach` 'zero': an object without approach_score counts approach 0 instead (the
 * reference's parse_judge_response where its schema does not require the key: batched judging).
 */
export function parseBinaryReply(reply: string, approach = true, missingApproach: 'error' | 'zero' = 'error'): JudgeGrades {
  const text = afterThinking(reply);
  const tail = quoteTail(reply);
  const v = verdictFromJson(text) ?? verdictFromText(text);
  if (!v) {
    throw new SlmError(
      'JUDGE_FAILED',
      `Expected the judge's reply to end with a JSON object ${binaryJudgeShape(approach)}, but found none in ${tail}. Use a stronger judge model, more max tokens, or a system prompt that asks for this object.`,
    );
  }
  const category = categoryOf(v.category);
  if (!category)
    throw new SlmError(
      'JUDGE_FAILED',
      `Expected the judge's category to be one of ${JUDGE_CATEGORIES.join(', ')}, but found ${describe(v.category)} in ${tail}.`,
    );
  let a: number | null = null;
  if (approach && v.approach === undefined && missingApproach === 'zero') a = 0;
  else if (approach) {
    const n = typeof v.approach === 'string' && v.approach.trim() !== '' ? Number(v.approach) : v.approach;
    if (typeof n !== 'number' || !Number.isFinite(n)) {
      throw new SlmError(
        'JUDGE_FAILED',
        `Expected the judge's approach_score to be a number from 0 to 100 beside the category, but found ${describe(v.approach)} in ${tail}.`,
      );
    }
    a = Math.min(100, Math.max(0, n)) / 100;
  }
  return { correctness: category === 'correct' ? 1 : 0, approach: a, category };
}

/** Read a judge reply of either format (default 'binary'). Throws JUDGE_FAILED when it cannot. */
export function parseJudgeReply(
  reply: string,
  approach = true,
  format: JudgeFormat = 'binary',
  missingApproach: 'error' | 'zero' = 'error',
): JudgeGrades {
  return format === 'graded' ? parseGradedReply(reply, approach) : parseBinaryReply(reply, approach, missingApproach);
}
