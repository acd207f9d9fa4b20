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
 *
 * The prompts are in judge-prompts.ts, the reading of replies in judge-parse.ts.
 */
import { SlmError, describe } from '../errors.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import type { JudgeBackend } from './judge-backends.js';
import { parseJudgeReply, type JudgeGrades } from './judge-parse.js';
import { judgeSystemPrompt, judgeUserMessage, referenceJudgeMessage, type JudgeFormat } from './judge-prompts.js';
import type { RewardContext, RewardFn, RewardParts } from './types.js';

export {
  judgeSystemPrompt,
  judgeUserMessage,
  referenceJudgeMessage,
  referenceTrajectory,
  REFERENCE_JUDGE_TEMPLATE,
  renderTrajectory,
  type JudgeFormat,
} from './judge-prompts.js';
export { parseBinaryReply, parseJudgeReply, type JudgeCategory, type JudgeGrades } from './judge-parse.js';

export type JudgeCombine = 'weighted' | 'sign_magnitude';
const JUDGE_FORMATS: readonly JudgeFormat[] = ['binary', 'graded'];

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
  /**
   * Episodes without an answer score correctness 0, approach 0 without a request (default true).
   * false: the judge is asked about them too (the reference code-search system's training judges
   * "(no answer)" with the trajectory), and their correctness is 0 whatever it says: with
   * 'sign_magnitude' they score -(1 - approach).
   */
  skipWithoutAnswer?: boolean;
  /**
   * Binary format: a verdict without approach_score is a failed judge call ('error', default: the
   * reference's recipe, whose schema requires the key, scores it -1) or approach 0 ('zero': the
   * reference's batched judging).
   */
  missingApproach?: 'error' | 'zero';
  /** Replaces the default system prompt (it must ask for the format's JSON object or lines). */
  systemPrompt?: string;
  /**
   * 'slm-train' (default): a system prompt with the rubric and a user message with the episode.
   * 'reference': the reference code-search system's own prompt as its only (user) message, the
   * trajectory written as its format_for_judge writes it, not cut (judge-prompts.ts
   * referenceJudgeMessage); binary format with approach only, no systemPrompt.
   */
  prompt?: 'slm-train' | 'reference';
  /** Prefix of the part names (default 'judge'). */
  name?: string;
}

// ---------------------------------------------------------------------------------------------
// Combining

/**
 * The combined judge value of two grades (see the module comment). `gaveUpReward`, when a number,
 * is the 'sign_magnitude' value of a "gave_up" category.
 */
export function combineGrades(
  grades: JudgeGrades,
  combine: JudgeCombine = 'weighted',
  weights: [number, number] = [0.75, 0.25],
  threshold = 0.7,
  gaveUpReward: number | null = null,
): number {
  if (grades.approach === null) return grades.correctness;
  if (combine === 'sign_magnitude') {
    if (grades.category === 'gave_up' && gaveUpReward !== null) return gaveUpReward;
    const a = Math.min(1, Math.max(0, grades.approach));
    return grades.correctness >= threshold ? a : -(1 - a) + 0; // + 0: no -0 in the logs
  }
  return weights[0] * grades.correctness + weights[1] * grades.approach;
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
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge option ${name} to be a number from ${lo} to ${hi}, but found ${describe(v)}.`,
    );
  }
}

/**
 * The judge as a RewardFn: parts `<name>_correctness`, `<name>_approach` (when asked for), `<name>`,
 * `<name>_error`, `<name>_skipped`, `<name>_matched`, and with the binary format `<name>_gave_up`.
 */
export function judgeReward(opts: JudgeOptions): RewardFn {
  if (!opts || typeof opts.backend?.complete !== 'function') {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected judgeReward({ backend }) with a backend from openAIJudgeBackend or engineJudgeBackend, but found ${describe(opts?.backend)}.`,
    );
  }
  checkUnit('correctThreshold', opts.correctThreshold, 0, 1);
  checkUnit('correctnessWeight', opts.correctnessWeight, -1e9, 1e9);
  checkUnit('approachWeight', opts.approachWeight, -1e9, 1e9);
  checkUnit('gaveUpReward', opts.gaveUpReward, -1e9, 1e9);
  const format = opts.format ?? 'binary';
  if (!JUDGE_FORMATS.includes(format))
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge option format to be one of ${JUDGE_FORMATS.join(', ')}, but found ${describe(format)}.`,
    );
  const approach = opts.approach ?? true;
  const combine = opts.combine ?? 'weighted';
  if (combine === 'sign_magnitude' && !approach) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `The judge's 'sign_magnitude' combination takes its magnitude from the approach grade, but approach is off. Turn approach on or use 'weighted'.`,
    );
  }
  const name = opts.name ?? 'judge';
  const threshold = opts.correctThreshold ?? 0.7;
  const weights: [number, number] = [opts.correctnessWeight ?? 0.75, opts.approachWeight ?? 0.25];
  const gaveUp = opts.gaveUpReward ?? null;
  const system = opts.systemPrompt ?? judgeSystemPrompt(approach, format);
  const maxChars = opts.maxTrajectoryChars ?? 12000;
  const promptKind = opts.prompt ?? 'slm-train';
  if (promptKind !== 'slm-train' && promptKind !== 'reference')
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge option prompt to be 'slm-train' or 'reference', but found ${describe(opts.prompt)}.`,
    );
  if (promptKind === 'reference' && (format !== 'binary' || !approach || opts.systemPrompt !== undefined))
    throw new SlmError(
      'ARGUMENT_INVALID',
      `The judge's 'reference' prompt asks for the binary verdict with an approach score and has no system prompt: it needs format 'binary', approach on and no systemPrompt (found format ${format}, approach ${approach}, systemPrompt ${opts.systemPrompt === undefined ? 'unset' : 'set'}).`,
    );
  if (opts.missingApproach !== undefined && opts.missingApproach !== 'error' && opts.missingApproach !== 'zero')
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge option missingApproach to be 'error' or 'zero', but found ${describe(opts.missingApproach)}.`,
    );

  const partsOf = (
    grades: JudgeGrades | null,
    flags: { error: number; skipped: number; matched: number },
  ): Record<string, number | null> => ({
    [`${name}_correctness`]: grades ? grades.correctness : null,
    ...(approach ? { [`${name}_approach`]: grades ? grades.approach : null } : {}),
    [name]: grades ? combineGrades(grades, combine, weights, threshold, gaveUp) : null,
    [`${name}_error`]: flags.error,
    [`${name}_skipped`]: flags.skipped,
    [`${name}_matched`]: flags.matched,
    ...(format === 'binary' ? { [`${name}_gave_up`]: grades ? (grades.category === 'gave_up' ? 1 : 0) : null } : {}),
  });

  return async (ctx: RewardContext): Promise<RewardParts> => {
    if (ctx.answer === null && (opts.skipWithoutAnswer ?? true)) {
      const g: JudgeGrades = { correctness: 0, approach: approach ? 0 : null };
      return { parts: partsOf(g, { error: 0, skipped: 1, matched: 0 }), correct: false };
    }
    if ((opts.matchShortcut ?? true) && matchesGold(ctx.answer, ctx.golds)) {
      const g: JudgeGrades = {
        correctness: 1,
        approach: approach ? 1 : null,
        ...(format === 'binary' ? { category: 'correct' as const } : {}),
      };
      return { parts: partsOf(g, { error: 0, skipped: 0, matched: 1 }), correct: true };
    }
    const messages: ChatMessage[] =
      promptKind === 'reference'
        ? [{ role: 'user', content: referenceJudgeMessage(ctx) }]
        : [
            { role: 'system', content: system },
            { role: 'user', content: judgeUserMessage(ctx, approach, maxChars) },
          ];
    try {
      const reply = await opts.backend.complete(messages);
      let grades: JudgeGrades;
      try {
        grades = parseJudgeReply(reply.text, approach, format, opts.missingApproach ?? 'error');
      } catch (e) {
        if (reply.truncated) (e as Error).message += ` The reply was cut at the token limit: raise max_tokens / max_new_tokens.`;
        throw e;
      }
      // No answer is never correct, whatever the judge says (the reference: `result.correct and final_answer is not None`).
      if (ctx.answer === null)
        grades = { ...grades, correctness: 0, ...(grades.category === 'correct' ? { category: 'incorrect' as const } : {}) };
      return { parts: partsOf(grades, { error: 0, skipped: 0, matched: 0 }), correct: grades.correctness >= threshold };
    } catch (e) {
      return {
        parts: partsOf(null, { error: 1, skipped: 0, matched: 0 }),
        errors: { [name]: `${opts.backend.description}: ${(e as Error).message}` },
      };
    }
  };
}
