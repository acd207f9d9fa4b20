/**
 * SFT data: chat-format rows `{messages: [{role, content}, ...]}` (environment replies as `user` or
 * `tool` messages, or inline in the assistant's text as Search-R1 writes `<information>` blocks)
 * turned into token ids and a loss mask that is 1 exactly on the model's own tokens of the assistant
 * turns (their content and the end-of-turn token), rendered with the model's own chat template.
 *
 * Each assistant turn is located by rendering the conversation up to it with the generation prompt
 * (the text the model sees before it speaks) and with it (the text after it has spoken): the
 * difference is what the model must produce. Pieces are tokenized separately at these boundaries,
 * which is also where generation starts and stops at run time.
 *
 * Where the template renders earlier turns differently once later messages follow (Qwen3's hybrid
 * template drops the `<think>` blocks of turns before the last user message), or with an explicit
 * `enableThinking` (protocol.enable_thinking), a conversation is built as the episode runner builds an
 * episode instead (`rolloutTokens`): the prompt, each assistant turn as written, and the template's
 * continuation after it, so that SFT trains on the token sequence a rollout samples on.
 */
import { readFileSync } from 'node:fs';
import { parseJsonLines } from '../../util/data.js';
import { SlmError, describe } from '../../errors.js';
import type { ChatFormatter } from '../../model/chat.js';
import type { ChatMessage, Tokenizer } from '../../model/tokenizer-types.js';
import { encodeRendered } from '../../episodes/episode-state.js';

export interface SftRow {
  messages: ChatMessage[];
  question?: string;
  in_test_split?: boolean;
  [k: string]: unknown;
}

export interface SftExample {
  ids: number[];
  mask: number[];
  /** Index of the row in its file. */
  row: number;
}

const ROLES = new Set(['system', 'user', 'assistant', 'tool']);

export function readSftRows(file: string): SftRow[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    throw new SlmError(
      'FILE_NOT_FOUND',
      `SFT data file ${file} cannot be read. Expected JSONL (or a JSON array) of {"messages": [{"role", "content"}, ...]} rows.`,
    );
  }
  const rows: unknown[] = text.trimStart().startsWith('[') ? JSON.parse(text) : parseJsonLines(text, file, 'DATA_INVALID');
  return rows.map((r, i) => {
    const msgs = (r as SftRow)?.messages;
    if (!Array.isArray(msgs) || !msgs.length)
      throw new SlmError(
        'DATA_INVALID',
        `${file}: row ${i + 1} has no "messages" list; expected {"messages": [{"role": "user", "content": "..."}, ...]}.${typeof (r as { question?: unknown })?.question === 'string' ? ' This row is a question ({question, answer}): rows {question, answer} belong in data.questions of a grpo, rloo, ppo or eval config.' : ''}`,
      );
    msgs.forEach((m, j) => {
      if (!m || !ROLES.has(m.role) || typeof m.content !== 'string')
        throw new SlmError(
          'DATA_INVALID',
          `${file}: row ${i + 1}, message ${j + 1}: expected {role: system|user|assistant|tool, content: string}, found role ${describe(m?.role)} and content ${describe(m?.content)}.`,
        );
    });
    if (!msgs.some((m) => m.role === 'assistant'))
      throw new SlmError('DATA_INVALID', `${file}: row ${i + 1} has no assistant message to train on.`);
    return r as SftRow;
  });
}

/**
 * Environment text written inside an assistant message, as Search-R1's trajectories carry the
 * retrieved passages inline (`<information>…</information>`, and `<python_output>…</python_output>`
 * likewise), with the whitespace around it: attended to, never trained on (state masking), and
 * tokenized on its own as the episode runner tokenizes an inline reply.
 */
const OBSERVATION = /\s*<(information|python_output)>[\s\S]*?<\/\1>\s*/g;

function splitObservations(text: string): Array<{ text: string; trained: boolean }> {
  const out: Array<{ text: string; trained: boolean }> = [];
  let at = 0;
  for (const m of text.matchAll(OBSERVATION)) {
    if (m.index! > at) out.push({ text: text.slice(at, m.index), trained: true });
    out.push({ text: m[0], trained: false });
    at = m.index! + m[0].length;
  }
  if (at < text.length) out.push({ text: text.slice(at), trained: true });
  return out;
}

/** How a conversation is rendered for SFT (protocol.enable_thinking). */
export interface ConversationOptions {
  /** The chat template's enable_thinking; set, the conversation is built as a rollout (rolloutTokens). */
  enableThinking?: boolean;
}

/**
 * Token ids and loss mask of one conversation: 1 on the assistant turns (their content and
 * end-of-turn token) except environment text inside them (splitObservations), 0 elsewhere. Rendered
 * by the template whole when it renders every turn as an extension of the one before and no
 * `enableThinking` is given; otherwise built as a rollout (rolloutTokens).
 */
export function tokenizeConversation(
  messages: readonly ChatMessage[],
  fmt: ChatFormatter,
  tok: Tokenizer,
  row = 0,
  opts: ConversationOptions = {},
): SftExample {
  if (opts.enableThinking !== undefined) return rolloutTokens(messages, fmt, tok, row, opts);
  return templateTokens(messages, fmt, tok, row) ?? rolloutTokens(messages, fmt, tok, row, opts);
}

/** The template's text that closes an assistant turn (`<|im_end|>`) when it is one of the stop texts; '' otherwise. */
function turnStop(fmt: ChatFormatter, prior: readonly ChatMessage[], thinking: { enableThinking?: boolean }): string {
  const mark = 'slm-train:sft-turn:3e8a1c';
  const text = fmt.render([...prior, { role: 'assistant', content: mark }], thinking);
  const after = text.slice(text.lastIndexOf(mark) + mark.length);
  return fmt.stopTexts.find((s) => s && after.startsWith(s)) ?? '';
}

/**
 * A conversation as the episode runner builds an episode from it (lib/episodes/episode-state.ts):
 * the prompt of the messages before the first assistant turn (generation prompt included); each
 * assistant turn's content as written, then the template's end-of-turn text (trained: what the model
 * generates, stop token included); between turns the template's continuation (the end of the turn,
 * the environment's messages, the next generation prompt), rendered with the history as generated.
 * With `enableThinking: false` a leading empty `<think></think>` block of a turn is the prompt's
 * (the template writes it there), not the turn's. Messages after the last assistant turn are left out
 * (a rollout ends with its last generation). Earlier turns' `<think>` blocks stay as written, as they
 * stay in a rollout's sequence.
 */
export function rolloutTokens(
  messages: readonly ChatMessage[],
  fmt: ChatFormatter,
  tok: Tokenizer,
  row = 0,
  opts: ConversationOptions = {},
): SftExample {
  const thinking = opts.enableThinking !== undefined ? { enableThinking: opts.enableThinking } : {};
  const first = messages.findIndex((m) => m.role === 'assistant');
  let last = messages.length - 1;
  while (last >= 0 && messages[last].role !== 'assistant') last--;
  if (first < 0) throw new SlmError('DATA_INVALID', `conversation ${row + 1} has no assistant message to train on.`);
  const ids: number[] = [];
  const mask: number[] = [];
  const push = (e: readonly number[], trained: boolean) => {
    ids.push(...e);
    for (let k = 0; k < e.length; k++) mask.push(trained ? 1 : 0);
  };
  const prompt = messages.slice(0, first);
  push(
    encodeRendered(tok, fmt.prompt(prompt, thinking), prompt, (ms) => fmt.prompt(ms, thinking)),
    false,
  );
  for (let i = first; i <= last; ) {
    let content = messages[i].content;
    if (opts.enableThinking === false) content = content.replace(/^\s*<think>\s*<\/think>\s*/, '');
    const generated = content + turnStop(fmt, messages.slice(0, i), thinking);
    for (const p of splitObservations(generated)) if (p.text) push(tok.encode(p.text), p.trained);
    let j = i + 1;
    while (j <= last && messages[j].role !== 'assistant') j++;
    if (j > last) break;
    const next = messages.slice(i + 1, j);
    if (!next.length)
      throw new SlmError(
        'DATA_INVALID',
        `conversation ${row + 1}: assistant messages ${i + 1} and ${j + 1} follow each other; a rollout puts an environment message between two turns (or writes them as one assistant message).`,
      );
    const history: ChatMessage[] = [...messages.slice(0, i), { role: 'assistant', content: generated }];
    const continuation = (ms: ChatMessage[]) => fmt.continuation(history, ms, { strict: false, ...thinking });
    push(encodeRendered(tok, continuation(next), next, continuation), false);
    i = j;
  }
  return { ids, mask, row };
}

/**
 * The conversation rendered by the template whole (see the file comment); null when the template
 * does not render an assistant turn as an extension of the prompt before it (it rewrites earlier
 * turns), so that the turn's tokens cannot be located in the whole.
 */
function templateTokens(messages: readonly ChatMessage[], fmt: ChatFormatter, tok: Tokenizer, row: number): SftExample | null {
  const full = fmt.render(messages);
  const pieces: Array<{ text: string; trained: boolean }> = [];
  let cursor = 0;
  for (let i = 0; i < messages.length; i++) {
    if (messages[i].role !== 'assistant') continue;
    const before = fmt.render(messages.slice(0, i), { addGenerationPrompt: true });
    const after = fmt.render(messages.slice(0, i + 1));
    if (!after.startsWith(before) || !full.startsWith(after) || before.length < cursor) return null;
    const turn = after.slice(before.length);
    // Train on the content and the end-of-turn token; what the template adds after it (a newline)
    // is context, like the prompt.
    const stop = fmt.stopTexts
      .map((s) => ({ s, at: turn.indexOf(s) }))
      .filter((x) => x.at >= 0)
      .sort((a, b) => a.at - b.at)[0];
    const trainedText = stop ? turn.slice(0, stop.at + stop.s.length) : turn;
    pieces.push({ text: full.slice(cursor, before.length), trained: false });
    pieces.push(...splitObservations(trainedText));
    cursor = before.length + trainedText.length;
  }
  pieces.push({ text: full.slice(cursor), trained: false });
  const ids: number[] = [];
  const mask: number[] = [];
  for (const p of pieces) {
    if (!p.text) continue;
    const e = tok.encode(p.text);
    ids.push(...e);
    for (let k = 0; k < e.length; k++) mask.push(p.trained ? 1 : 0);
  }
  return { ids, mask, row };
}

/** Sorts examples by length and cuts them into batches of at most `batchTokens` padded tokens. */
export function batchByLength(examples: SftExample[], batchSize: number, maxTokens = Infinity): SftExample[][] {
  const sorted = [...examples].sort((a, b) => a.ids.length - b.ids.length);
  const out: SftExample[][] = [];
  let cur: SftExample[] = [];
  for (const e of sorted) {
    const longest = Math.max(e.ids.length, ...cur.map((c) => c.ids.length));
    if (cur.length && (cur.length >= batchSize || longest * (cur.length + 1) > maxTokens)) {
      out.push(cur);
      cur = [];
    }
    cur.push(e);
  }
  if (cur.length) out.push(cur);
  return out;
}

/**
 * Conversations longer than `maxTokens` are cut to their first `maxTokens` tokens (the loss covers
 * the assistant tokens that fit, as the reference's tokenizer truncation does) instead of being
 * dropped: the longest trajectories are the multi-search ones worth learning from. One that keeps
 * no assistant token within the limit cannot teach anything and is dropped. Returns the examples
 * and how many were truncated and dropped.
 */
export function fitContext(
  examples: readonly SftExample[],
  maxTokens: number,
): { examples: SftExample[]; truncated: number; dropped: number } {
  if (!Number.isInteger(maxTokens) || maxTokens < 2)
    throw new SlmError('ARGUMENT_INVALID', `maxTokens must be an integer >= 2, found ${describe(maxTokens)}.`);
  const out: SftExample[] = [];
  let truncated = 0;
  let dropped = 0;
  for (const e of examples) {
    if (e.ids.length <= maxTokens) {
      out.push(e);
      continue;
    }
    const mask = e.mask.slice(0, maxTokens);
    if (!mask.some((m) => m)) {
      dropped++;
      continue;
    }
    truncated++;
    out.push({ ids: e.ids.slice(0, maxTokens), mask, row: e.row });
  }
  return { examples: out, truncated, dropped };
}

/**
 * The prompts a set of conversations was written under: the system message, and the reminder the
 * environment sent before the last turn (a user message right after another user message — the
 * observation — and right before the final assistant message, e.g. the reference's "[FINAL TURN]
 * ..."). Each is the most common one among the rows that have it, with how many rows agree, so that
 * RL and evaluation can ask for the behaviour under the very prompt SFT taught it with.
 */
export function sftPrompts(rows: readonly SftRow[]): {
  system: string | null;
  systemRows: number;
  finalTurn: string | null;
  finalTurnRows: number;
  rows: number;
} {
  const count = (xs: string[]) => {
    const c = new Map<string, number>();
    for (const x of xs) c.set(x, (c.get(x) ?? 0) + 1);
    let best: string | null = null;
    let n = 0;
    for (const [k, v] of c) if (v > n) [best, n] = [k, v];
    return { best, n };
  };
  const systems: string[] = [];
  const notices: string[] = [];
  for (const r of rows) {
    const m = r.messages;
    if (m[0]?.role === 'system') systems.push(m[0].content);
    const last = m.map((x) => x.role).lastIndexOf('assistant');
    if (last >= 2 && m[last - 1].role === 'user' && (m[last - 2].role === 'user' || m[last - 2].role === 'tool'))
      notices.push(m[last - 1].content);
  }
  const s = count(systems);
  const f = count(notices);
  return { system: s.best, systemRows: s.n, finalTurn: f.best, finalTurnRows: f.n, rows: rows.length };
}
