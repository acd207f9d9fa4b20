/**
 * The LLM judge as a reward component. One request per episode asks a judge model (served by the
 * native engine or an OpenAI-compatible endpoint: judge-backends.ts) about the final answer and,
 * optionally, the approach. Two reply formats:
 *
 * - `binary` (default; the reference project's judge): the reply ends with a JSON object
 *   `{"category": "correct" | "incorrect" | "gave_up", "approach_score": 0-100}`. The correctness
 *   part is 1 for "correct" and 0 otherwise, the approach part approach_score / 100, and
 *   `judge_gave_up` is 1 for "gave_up". The object is found after any `<think>` block, inside
 *   markdown fences or among other text (the last object with a category wins; a loose
 *   `category: correct` line is read when no object parses). An approach score outside 0-100 is
 *   clamped, as the reference does.
 * - `graded`: the reply ends with `Correctness: N` / `Approach: N` lines (0-10, the last occurrence,
 *   after any `<think>` block), each divided by 10: a 5 counts 0.5.
 *
 * So the parts are in [0, 1] in both formats:
 *
 *   judge_correctness = c,  judge_approach = a,  judge_error = 0
 *   judge = 0.75·c + 0.25·a                          (combine 'weighted', weights configurable)
 *   judge = c >= threshold ? +a : -(1 - a)           (combine 'sign_magnitude', the reference's
 *                                                     formula: a right answer earns its approach, a
 *                                                     wrong one loses what its approach lacked)
 *   correct = c >= threshold                          (threshold default 0.7: "7 of 10"; binary c is 1 or 0)
 *
 * With 'sign_magnitude', a correct answer with approach 90 scores +0.9, a wrong one -0.1; with
 * approach 10, +0.1 and -0.9. `gaveUpReward` (default null: "gave_up" scores as any wrong answer,
 * -(1 - a)) replaces that value for a "gave_up" category, e.g. -1.5. The reference's recipe
 * (configs/rl.yaml, one answer per judge call) computes -(1 - a) for gave_up too; its batched
 * judging and its standalone get_judge_reward give -1.5.
 *
 * Before any request (the reference's shortcuts):
 * - match shortcut (`matchShortcut`, default on): an answer whose lowercased, trimmed text equals a
 *   gold answer or contains one counts correct with approach 1 (`judge_matched: 1`), so the judge
 *   value is 1 under both combinations. Containment is literal: gold "12" matches "2012".
 * - no answer (`skipWithoutAnswer`, default on): correctness 0, approach 0, `judge_skipped: 1`, so
 *   'sign_magnitude' gives -(1 - 0) = -1 and 'weighted' 0.
 *
 * A judge that fails (network, timeout, HTTP error, a reply without the expected JSON or lines)
 * gives null parts, `judge_error: 1` and the reason in `errors.judge`: a failure is recorded, never
 * a silent zero. What a failed episode scores is the composition's business (combine.ts: the
 * reference's -1 by default, or the episode is excluded).
 */
import { SlmError, describe } from '../errors.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import type { JudgeBackend } from './judge-backends.js';
import type { RewardContext, RewardFn, RewardParts } from './types.js';

export type JudgeCombine = 'weighted' | 'sign_magnitude';
/** The reply format the judge is asked for (see the module comment). */
export type JudgeFormat = 'binary' | 'graded';
const JUDGE_FORMATS: readonly JudgeFormat[] = ['binary', 'graded'];
export type JudgeCategory = 'correct' | 'incorrect' | 'gave_up';
const JUDGE_CATEGORIES: readonly JudgeCategory[] = ['correct', 'incorrect', 'gave_up'];

export interface JudgeOptions {
  backend: JudgeBackend;
  /** The reply format (default 'binary', the reference's). */
  format?: JudgeFormat;
  /** Ask for the approach grade too (default true). Without it `judge` = correctness. */
  approach?: boolean;
  /** How `judge` combines the two grades (default 'weighted'). */
  combine?: JudgeCombine;
  /** Weights of 'weighted' (default 0.75 and 0.25). */
  correctnessWeight?: number;
  approachWeight?: number;
  /** Correctness at or above this counts as correct, and as the + sign (default 0.7). */
  correctThreshold?: number;
  /**
   * Binary format, 'sign_magnitude': the `judge` value of a "gave_up" category (e.g. -1.5); null
   * (default) scores it as any wrong answer, -(1 - approach).
   */
  gaveUpReward?: number | null;
  /** An answer that equals or contains a gold answer (lowercased, trimmed) is correct without a request (default true). */
  matchShortcut?: boolean;
  /** The trajectory shown to the judge is cut in the middle beyond this many characters (default 12000). */
  maxTrajectoryChars?: number;
  /** Episodes without an answer score correctness 0, approach 0 without a request (default true). */
  skipWithoutAnswer?: boolean;
  /** Replaces the default system prompt (it must ask for the format's JSON object or lines). */
  systemPrompt?: string;
  /** Prefix of the part names (default 'judge'). */
  name?: string;
}

// ---------------------------------------------------------------------------------------------
// Prompts

const RUBRIC_CORRECTNESS = `Correctness: does the final answer state the same fact as one of the reference answers?
- 10: the same entity, number, date or statement, in any wording (abbreviations, a fuller name, extra correct detail are fine)
- 5: partly right (the right year but the wrong day; one of two things asked for)
- 0: wrong, missing, "I don't know", or hedging between several candidates`;

const RUBRIC_APPROACH = `Approach: how well did the assistant work towards its answer?
- 10: searched for what the question needs, read the relevant results, and based the answer on what it found
- 5: got there with wasted or repeated steps, or without checking the sources it found
- 0: no searching, guessing, or ignoring what the searches returned
Grade the approach on its own: a good approach can end in a wrong answer, and a lucky guess is a poor approach.`;

const RUBRIC_CATEGORY = `"category": which one describes the final answer?
- "correct": it states the same fact as one of the reference answers, in any wording (an abbreviation, a fuller name, a unit or extra correct detail are fine: "42 years old" matches "42", "NYC" matches "New York City")
- "incorrect": it commits to an answer that is wrong, or hedges between several candidates
- "gave_up": it gives no real answer ("Unknown", "Not found", "N/A", "I could not determine it", nothing)
Giving up is worse than a wrong answer.`;

const RUBRIC_APPROACH_SCORE = `"approach_score": an integer from 0 to 100, the sum of four parts of up to 25 each:
- queries: it searched for what the question needs, with targeted rather than generic queries
- efficiency: no wasted turns, no repeated failing steps
- sources: it found and read the documents that hold the answer
- reasoning: the answer follows from what it read
Score the approach on its own: a careful search can end in a wrong answer, and a lucky guess is a poor approach.`;

/** The JSON object a binary-format reply must end with, as the prompt shows it. */
function binaryJudgeShape(approach = true): string {
  return `{"category": "correct" | "incorrect" | "gave_up"${approach ? ', "approach_score": <0-100>' : ''}}`;
}

/** The default system prompt of a format: the rubric, then exactly what the reply must end with. */
export function judgeSystemPrompt(approach = true, format: JudgeFormat = 'binary'): string {
  const intro = [
    'You grade the work of an assistant that answers factual questions by searching a collection of documents.',
    `You are given the question, the reference answer(s), the assistant's final answer${approach ? ' and its trajectory (its steps and what they returned)' : ''}.`,
  ];
  if (format === 'binary') {
    return [
      ...intro,
      approach ? 'Judge two things: the category of the final answer and the quality of the approach.' : 'Judge the category of the final answer.',
      RUBRIC_CATEGORY,
      ...(approach ? [RUBRIC_APPROACH_SCORE] : []),
      `Think briefly if you need to, then end your reply with one JSON object and nothing after it:\n${binaryJudgeShape(approach)}`,
    ].join('\n\n');
  }
  return [
    ...intro,
    approach ? 'Give two grades, each an integer from 0 to 10.' : 'Give one grade, an integer from 0 to 10.',
    RUBRIC_CORRECTNESS,
    ...(approach ? [RUBRIC_APPROACH] : []),
    `Think briefly if you need to, then end your reply with exactly ${approach ? 'these two lines' : 'this line'}:\nCorrectness: <0-10>${approach ? '\nApproach: <0-10>' : ''}`,
  ].join('\n\n');
}

/**
 * The trajectory as text: every message after the system prompt and the first user message (the
 * question, given separately), each headed by its role; cut in the middle beyond `maxChars`.
 */
export function renderTrajectory(messages: readonly ChatMessage[] | undefined, maxChars = 12000): string {
  if (!messages || messages.length === 0) return '(not available)';
  const firstUser = messages.findIndex((m) => m.role === 'user');
  const steps = messages.filter((m, i) => m.role !== 'system' && i !== firstUser);
  if (steps.length === 0) return '(no steps: the assistant wrote nothing)';
  const text = steps.map((m) => `[${m.role}]\n${(m.content ?? '').trim()}`).join('\n\n');
  if (text.length <= maxChars) return text;
  const head = Math.floor(maxChars / 2);
  const tail = maxChars - head;
  return `${text.slice(0, head)}\n[... ${text.length - maxChars} characters left out ...]\n${text.slice(text.length - tail)}`;
}

/** The user message the judge reads (the same for both formats). */
export function judgeUserMessage(ctx: RewardContext, approach = true, maxTrajectoryChars = 12000): string {
  const golds = ctx.golds.length ? ctx.golds.map((g) => `- ${g}`).join('\n') : '- (none given)';
  const answer = ctx.answer === null ? '(none: the assistant ended without an answer)' : ctx.answer.trim() || '(empty)';
  const parts = [`Question: ${ctx.question}`, `Reference answer(s):\n${golds}`, `Final answer: ${answer}`];
  if (approach) parts.push(`Trajectory:\n<trajectory>\n${renderTrajectory(ctx.episode?.messages, maxTrajectoryChars)}\n</trajectory>`);
  return parts.join('\n\n');
}

// ---------------------------------------------------------------------------------------------
// Parsing replies

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
      throw new SlmError('JUDGE_FAILED', `Expected the judge's reply to end with a line "${label[0].toUpperCase() + label.slice(1)}: <0-10>", but found none in ${tail}. Use a stronger judge model, more max tokens, or a system prompt that asks for these lines.`);
    }
    const v = Number(raw);
    if (!(v >= 0 && v <= 10)) throw new SlmError('JUDGE_FAILED', `Expected the judge's ${label} grade to be from 0 to 10, but found ${raw} in ${tail}.`);
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
  const s = v.trim().toLowerCase().replace(/[\s-]+/g, '_');
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
 */
export function parseBinaryReply(reply: string, approach = true): JudgeGrades {
  const text = afterThinking(reply);
  const tail = quoteTail(reply);
  const v = verdictFromJson(text) ?? verdictFromText(text);
  if (!v) {
    throw new SlmError('JUDGE_FAILED', `Expected the judge's reply to end with a JSON object ${binaryJudgeShape(approach)}, but found none in ${tail}. Use a stronger judge model, more max tokens, or a system prompt that asks for this object.`);
  }
  const category = categoryOf(v.category);
  if (!category) throw new SlmError('JUDGE_FAILED', `Expected the judge's category to be one of ${JUDGE_CATEGORIES.join(', ')}, but found ${describe(v.category)} in ${tail}.`);
  let a: number | null = null;
  if (approach) {
    const n = typeof v.approach === 'string' && v.approach.trim() !== '' ? Number(v.approach) : v.approach;
    if (typeof n !== 'number' || !Number.isFinite(n)) {
      throw new SlmError('JUDGE_FAILED', `Expected the judge's approach_score to be a number from 0 to 100 beside the category, but found ${describe(v.approach)} in ${tail}.`);
    }
    a = Math.min(100, Math.max(0, n)) / 100;
  }
  return { correctness: category === 'correct' ? 1 : 0, approach: a, category };
}

/** Read a judge reply of either format (default 'binary'). Throws JUDGE_FAILED when it cannot. */
export function parseJudgeReply(reply: string, approach = true, format: JudgeFormat = 'binary'): JudgeGrades {
  return format === 'graded' ? parseGradedReply(reply, approach) : parseBinaryReply(reply, approach);
}

// ---------------------------------------------------------------------------------------------
// Combining

/**
 * The combined judge value of two grades (see the module comment). `gaveUpReward`, when a number,
 * is the 'sign_magnitude' value of a "gave_up" category.
 */
export function combineGrades(g: JudgeGrades, combine: JudgeCombine = 'weighted', weights: [number, number] = [0.75, 0.25], threshold = 0.7, gaveUpReward: number | null = null): number {
  if (g.approach === null) return g.correctness;
  if (combine === 'sign_magnitude') {
    if (g.category === 'gave_up' && gaveUpReward !== null) return gaveUpReward;
    const a = Math.min(1, Math.max(0, g.approach));
    return g.correctness >= threshold ? a : -(1 - a) + 0; // + 0: no -0 in the logs
  }
  return weights[0] * g.correctness + weights[1] * g.approach;
}

/** The reference's deterministic match: a lowercased, trimmed answer equal to or containing a gold. */
export function matchesGold(answer: string | null, golds: readonly string[]): boolean {
  if (answer === null) return false;
  const a = answer.trim().toLowerCase();
  return golds.some((g) => {
    const x = String(g).trim().toLowerCase();
    return x !== '' && (a === x || a.includes(x));
  });
}

function checkUnit(name: string, v: number | undefined | null, lo: number, hi: number): void {
  if (v !== undefined && v !== null && !(typeof v === 'number' && v >= lo && v <= hi)) {
    throw new SlmError('ARGUMENT_INVALID', `Expected the judge option ${name} to be a number from ${lo} to ${hi}, but found ${describe(v)}.`);
  }
}

/**
 * The judge as a RewardFn: parts `<name>_correctness`, `<name>_approach` (when asked for), `<name>`,
 * `<name>_error`, `<name>_skipped`, `<name>_matched`, and with the binary format `<name>_gave_up`.
 */
export function judgeReward(opts: JudgeOptions): RewardFn {
  if (!opts || typeof opts.backend?.complete !== 'function') {
    throw new SlmError('ARGUMENT_INVALID', `Expected judgeReward({ backend }) with a backend from openAIJudgeBackend or engineJudgeBackend, but found ${describe(opts?.backend)}.`);
  }
  checkUnit('correctThreshold', opts.correctThreshold, 0, 1);
  checkUnit('correctnessWeight', opts.correctnessWeight, -1e9, 1e9);
  checkUnit('approachWeight', opts.approachWeight, -1e9, 1e9);
  checkUnit('gaveUpReward', opts.gaveUpReward, -1e9, 1e9);
  const format = opts.format ?? 'binary';
  if (!JUDGE_FORMATS.includes(format)) throw new SlmError('ARGUMENT_INVALID', `Expected the judge option format to be one of ${JUDGE_FORMATS.join(', ')}, but found ${describe(format)}.`);
  const approach = opts.approach ?? true;
  const combine = opts.combine ?? 'weighted';
  if (combine === 'sign_magnitude' && !approach) {
    throw new SlmError('ARGUMENT_INVALID', `The judge's 'sign_magnitude' combination takes its magnitude from the approach grade, but approach is off. Turn approach on or use 'weighted'.`);
  }
  const name = opts.name ?? 'judge';
  const threshold = opts.correctThreshold ?? 0.7;
  const weights: [number, number] = [opts.correctnessWeight ?? 0.75, opts.approachWeight ?? 0.25];
  const gaveUp = opts.gaveUpReward ?? null;
  const system = opts.systemPrompt ?? judgeSystemPrompt(approach, format);
  const maxChars = opts.maxTrajectoryChars ?? 12000;

  const partsOf = (g: JudgeGrades | null, flags: { error: number; skipped: number; matched: number }): Record<string, number | null> => ({
    [`${name}_correctness`]: g ? g.correctness : null,
    ...(approach ? { [`${name}_approach`]: g ? g.approach : null } : {}),
    [name]: g ? combineGrades(g, combine, weights, threshold, gaveUp) : null,
    [`${name}_error`]: flags.error,
    [`${name}_skipped`]: flags.skipped,
    [`${name}_matched`]: flags.matched,
    ...(format === 'binary' ? { [`${name}_gave_up`]: g ? (g.category === 'gave_up' ? 1 : 0) : null } : {}),
  });

  return async (ctx: RewardContext): Promise<RewardParts> => {
    if (ctx.answer === null && (opts.skipWithoutAnswer ?? true)) {
      const g: JudgeGrades = { correctness: 0, approach: approach ? 0 : null };
      return { parts: partsOf(g, { error: 0, skipped: 1, matched: 0 }), correct: false };
    }
    if ((opts.matchShortcut ?? true) && matchesGold(ctx.answer, ctx.golds)) {
      const g: JudgeGrades = { correctness: 1, approach: approach ? 1 : null, ...(format === 'binary' ? { category: 'correct' as const } : {}) };
      return { parts: partsOf(g, { error: 0, skipped: 0, matched: 1 }), correct: true };
    }
    const messages: ChatMessage[] = [
      { role: 'system', content: system },
      { role: 'user', content: judgeUserMessage(ctx, approach, maxChars) },
    ];
    try {
      const reply = await opts.backend.complete(messages);
      let grades: JudgeGrades;
      try {
        grades = parseJudgeReply(reply.text, approach, format);
      } catch (e) {
        if (reply.truncated) (e as Error).message += ` The reply was cut at the token limit: raise max_tokens / max_new_tokens.`;
        throw e;
      }
      return { parts: partsOf(grades, { error: 0, skipped: 0, matched: 0 }), correct: grades.correctness >= threshold };
    } catch (e) {
      return { parts: partsOf(null, { error: 1, skipped: 0, matched: 0 }), errors: { [name]: `${opts.backend.description}: ${(e as Error).message}` } };
    }
  };
}
