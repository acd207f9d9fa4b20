/**
 * Search-R1's protocol as pure functions (DESIGN §1): the model reasons in `<think>`, asks
 * `<search>query</search>`, gets the top-k passages inside `<information>…</information>` as
 * `Doc i(Title: …) text` lines, and ends with `<answer>…</answer>`.
 *
 * As in Search-R1: the first complete `<search>` or `<answer>` block is the action (an unclosed one
 * is skipped, like its `re.search`), the observation is appended to the assistant's own text as
 * `\n\n<information>…</information>\n\n`, and an invalid turn gets the "my previous action is
 * invalid" note (reworded) and the episode goes on. Departures: `<think>` spans are ignored when
 * looking for the action, and an empty query is answered with that note instead of a search.
 */
import { scanBlocks, type NoAction } from './blocks.js';

export type TagsAction = { kind: 'search'; query: string; end: number } | { kind: 'answer'; answer: string; end: number } | NoAction;

/** The action of one generated turn; query and answer are trimmed. */
export function parseTagsTurn(text: string): TagsAction {
  const r = scanBlocks(text, [{ tag: 'search' }, { tag: 'answer' }]);
  if (!r.found) return r.open ? { kind: 'none', reason: 'unclosed', open: r.open } : { kind: 'none', reason: 'no_action' };
  if (r.tag === 'answer') return { kind: 'answer', answer: r.content.trim(), end: r.end };
  const query = r.content.trim();
  if (query === '') return { kind: 'none', reason: 'empty_query' };
  return { kind: 'search', query, end: r.end };
}

/** A retrieved passage (lib/retrieval's `searchPassages` returns these). */
export interface PassageLike {
  title: string;
  text: string;
}

/** Search-R1's `_passages2string`: one `Doc i(Title: title) text` line per passage, numbered from 1. */
export function formatPassages(passages: readonly PassageLike[]): string {
  return passages.map((p, i) => `Doc ${i + 1}(Title: ${oneLine(p.title)}) ${p.text.trim()}`).join('\n');
}

/** The observation appended after a search: `\n\n<information>{passages}</information>\n\n`. */
export function formatInformation(passages: readonly PassageLike[]): string {
  const body = passages.length ? formatPassages(passages) : 'No passages matched the query.';
  return `\n\n<information>${body}</information>\n\n`;
}

/** The note after a turn without a valid action (Search-R1's, reworded); inline, in the model's voice as there. */
export function tagsFeedback(action: NoAction): string {
  const what = action.reason === 'empty_query' ? 'My previous search query was empty.' : 'My previous action is invalid.';
  return `\n${what} To search, I should put the query between <search> and </search>. To give the final answer, I should put it between <answer> and </answer>. Let me try again.\n`;
}

function oneLine(s: string): string {
  return s.replace(/\s+/g, ' ').trim();
}
