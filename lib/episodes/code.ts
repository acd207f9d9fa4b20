/**
 * The `code` protocol of the reference project, as pure functions (DESIGN §1):
 * the model writes a program inside `<python>…</python>`, the program's printed output comes back
 * inside `<python_output>…</python_output>`, and the episode ends with `<answer>…</answer>`.
 *
 * Where this departs from the reference agent, and why:
 * - The action is found by position (see blocks.ts): `<python>print("<answer>x</answer>")</python>`
 *   is code. The reference looked for `<answer>` first anywhere in the turn, so an answer printed by
 *   a program counted as the model's answer.
 * - A failing program's printed output is kept, followed by its `Error:` line; the reference showed
 *   the error line only. The error line is never cut by the output cap.
 * - A turn with no runnable action (no tags, an unclosed or empty `<python>`) gets a short message
 *   saying what was wrong; the reference sent nothing and let the model talk again.
 * Kept as in the reference: the output cap (6000 characters, 40 % from the start and 40 % from the
 * end, the `... [N chars truncated] ...` marker that the SFT trajectories show), the observation's
 * shape `<python_output>\n…\n</python_output>`, first `<answer>` wins, and the final-turn reminder.
 */
import { scanBlocks, trimCode, type NoAction } from './blocks.js';

export type { NoAction, NoActionReason } from './blocks.js';

export interface CodeTags {
  /** The code tag (`python`); the output tag is `${code}_output`. */
  code: string;
  answer: string;
}
export const CODE_TAGS: CodeTags = { code: 'python', answer: 'answer' };

export type CodeAction =
  /** `end`: index just after the closing tag (the text after it is not part of the action). */
  { kind: 'code'; code: string; end: number } | { kind: 'answer'; answer: string; end: number } | NoAction;

/**
 * The action of one generated assistant turn. The answer is trimmed (it may be empty: an empty
 * `<answer></answer>` still ends the episode, as in the reference and Search-R1); the code loses
 * the newline after `<python>` and trailing whitespace.
 */
export function parseCodeTurn(text: string, tags: CodeTags = CODE_TAGS): CodeAction {
  const r = scanBlocks(text, [{ tag: tags.code, opaque: true }, { tag: tags.answer }]);
  if (!r.found) return r.open ? { kind: 'none', reason: 'unclosed', open: r.open } : { kind: 'none', reason: 'no_action' };
  if (r.tag === tags.answer) return { kind: 'answer', answer: r.content.trim(), end: r.end };
  const code = trimCode(r.content);
  if (code.trim() === '') return { kind: 'none', reason: 'empty_code' };
  return { kind: 'code', code, end: r.end };
}

/** What a program run produced (a SandboxResult satisfies it). */
export interface ProgramOutput {
  stdout: string;
  error: string | null;
  timed_out: boolean;
}

export interface ObservationOptions {
  /** Cap on the printed output shown to the model, in characters (default 6000, as the reference). */
  maxChars?: number;
  tags?: CodeTags;
}

export const DEFAULT_OBSERVATION_CHARS = 6000;

/**
 * Keeps the first and last 40 % of `maxChars` of an over-long text with the reference's marker
 * between them (`\n\n... [N chars truncated] ...\n\n`), so the summary a program prints at its end
 * survives. Texts within the cap come back unchanged.
 */
export function truncateMiddle(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  const keep = Math.max(0, Math.floor(maxChars * 0.4));
  const removed = text.length - 2 * keep;
  return `${text.slice(0, keep)}\n\n... [${removed} chars truncated] ...\n\n${keep > 0 ? text.slice(-keep) : ''}`;
}

/** The `Error: …` line for a run, or null when the program ran to its end. */
export function errorLine(out: ProgramOutput): string | null {
  if (out.error) return `Error: ${out.error.trim()}`;
  if (out.timed_out) return 'Error: TimeoutError: the program ran past the time limit and was stopped';
  return null;
}

/**
 * The observation for a program run: `<python_output>\n{output}\n</python_output>`, where output is
 * the printed text (capped, see truncateMiddle) followed by the error line when the program failed
 * (`Error: NameError: name 'x' is not defined`), or a note when it printed nothing.
 */
export function formatCodeObservation(out: ProgramOutput, opts: ObservationOptions = {}): string {
  const tags = opts.tags ?? CODE_TAGS;
  const maxChars = opts.maxChars ?? DEFAULT_OBSERVATION_CHARS;
  const err = errorLine(out);
  let body = truncateMiddle(out.stdout ?? '', maxChars);
  if (err) body = body === '' ? err : `${body}${body.endsWith('\n') ? '' : '\n'}${err}`;
  else if (body.trim() === '') body = '(the program printed nothing: print() what you want to see)';
  return `<${tags.code}_output>\n${body}\n</${tags.code}_output>`;
}

export interface FeedbackContext {
  /** How the generation of the turn ended. */
  finishReason?: 'stop_token' | 'stop_string' | 'length';
  /** The per-turn token limit, for the message about a cut-off program. */
  maxNewTokens?: number;
  tags?: CodeTags;
}

/**
 * What the environment says after a turn with no runnable action, so the model can fix its next
 * turn. (Episodes go on after it; the final turn never gets one: it ends the episode.)
 */
export function codeFeedback(action: NoAction, ctx: FeedbackContext = {}): string {
  const { code, answer } = ctx.tags ?? CODE_TAGS;
  const how = `Write code inside <${code}>...</${code}>, or give the final answer inside <${answer}>...</${answer}>.`;
  if (action.reason === 'empty_code') return `Your <${code}> block was empty, so nothing ran. ${how}`;
  if (action.reason === 'no_action') return `Your reply had no <${code}> code and no <${answer}>. ${how}`;
  const cut = ctx.finishReason === 'length' ? ` (the reply reached the limit of ${ctx.maxNewTokens ?? 'the'} tokens)` : '';
  if (action.open === code)
    return `Your <${code}> block was not closed with </${code}>${cut}, so it did not run. Write a shorter program and end it with </${code}>.`;
  if (action.open === answer)
    return `Your <${answer}> was not closed with </${answer}>${cut}. Give the final answer as <${answer}>your answer</${answer}>.`;
  if (action.open === 'think')
    return `Your reply ended inside <think>${cut} without an action. Keep the reasoning short, close it with </think>, then ${how[0].toLowerCase()}${how.slice(1)}`;
  return how;
}

/** The reminder sent before the last turn (the reference's `[FINAL TURN]` message, reworded). */
export function finalTurnNotice(tags: CodeTags = CODE_TAGS): string {
  return `[FINAL TURN] You MUST give your answer NOW, as <${tags.answer}>your answer</${tags.answer}>. A partial or uncertain answer is better than no answer.`;
}
