/**
 * SFT data: chat-format rows `{messages: [{role, content}, ...]}` (environment replies as `user` or
 * `tool` messages) turned into token ids and a loss mask that is 1 exactly on the assistant turns'
 * tokens (their content and the end-of-turn token), rendered with the model's own chat template.
 *
 * Each assistant turn is located by rendering the conversation up to it with the generation prompt
 * (the text the model sees before it speaks) and with it (the text after it has spoken): the
 * difference is what the model must produce. Pieces are tokenized separately at these boundaries,
 * which is also where generation starts and stops at run time.
 */
import { readFileSync } from 'node:fs';
import { parseJsonLines } from '../util/data.js';
import { SlmError, describe } from '../errors.js';
import type { ChatFormatter } from '../model/chat.js';
import type { ChatMessage, Tokenizer } from '../model/tokenizer-types.js';

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
    throw new SlmError('FILE_NOT_FOUND', `SFT data file ${file} cannot be read. Expected JSONL (or a JSON array) of {"messages": [{"role", "content"}, ...]} rows.`);
  }
  const rows: unknown[] = text.trimStart().startsWith('[') ? JSON.parse(text) : parseJsonLines(text, file, 'DATA_INVALID');
  return rows.map((r, i) => {
    const msgs = (r as SftRow)?.messages;
    if (!Array.isArray(msgs) || !msgs.length)
      throw new SlmError(
        'DATA_INVALID',
        `${file}: row ${i + 1} has no "messages" list; expected {"messages": [{"role": "user", "content": "..."}, ...]}.${typeof (r as { question?: unknown })?.question === 'string' ? ' This row is a question ({question, answer}): rows {question, answer} belong in data.questions of a grpo, ppo or eval config.' : ''}`,
      );
    msgs.forEach((m, j) => {
      if (!m || !ROLES.has(m.role) || typeof m.content !== 'string')
        throw new SlmError('DATA_INVALID', `${file}: row ${i + 1}, message ${j + 1}: expected {role: system|user|assistant|tool, content: string}, found role ${describe(m?.role)} and content ${describe(m?.content)}.`);
    });
    if (!msgs.some((m) => m.role === 'assistant')) throw new SlmError('DATA_INVALID', `${file}: row ${i + 1} has no assistant message to train on.`);
    return r as SftRow;
  });
}

/** Token ids and assistant-only loss mask of one conversation. */
export function tokenizeConversation(messages: readonly ChatMessage[], fmt: ChatFormatter, tok: Tokenizer, row = 0): SftExample {
  const full = fmt.render(messages);
  const pieces: Array<{ text: string; trained: boolean }> = [];
  let cursor = 0;
  messages.forEach((m, i) => {
    if (m.role !== 'assistant') return;
    const before = fmt.render(messages.slice(0, i), { addGenerationPrompt: true });
    const after = fmt.render(messages.slice(0, i + 1));
    if (!after.startsWith(before) || !full.startsWith(after) || before.length < cursor)
      throw new SlmError(
        'CHAT_TEMPLATE_ERROR',
        `conversation ${row + 1}: the chat template (${fmt.template.origin}) does not render assistant turn ${i + 1} as an extension of the prompt before it, so its tokens cannot be located. Use a template that renders earlier turns verbatim (e.g. Qwen3-2507's).`,
      );
    let turn = after.slice(before.length);
    // Train on the content and the end-of-turn token; what the template adds after it (a newline)
    // is context, like the prompt.
    const stop = fmt.stopTexts.map((s) => ({ s, at: turn.indexOf(s) })).filter((x) => x.at >= 0).sort((a, b) => a.at - b.at)[0];
    const trainedText = stop ? turn.slice(0, stop.at + stop.s.length) : turn;
    pieces.push({ text: full.slice(cursor, before.length), trained: false });
    pieces.push({ text: trainedText, trained: true });
    cursor = before.length + trainedText.length;
    turn = '';
  });
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
