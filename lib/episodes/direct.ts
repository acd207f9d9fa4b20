/**
 * The `direct` protocol: no search, the model answers from what it knows inside
 * `<answer>…</answer>` (the closed-book baseline of Search-R1's tables). A turn without an answer
 * gets a short note and, when turns remain, another try.
 */
import type { ChatMessage } from '../model/tokenizer-types.js';
import { scanBlocks } from './blocks.js';
import type { EpisodeProtocol } from './protocol.js';

function directInstruction(question: string): string {
  return `Answer the question below from what you know. Give only the answer, between <answer> and </answer>, for example <answer> Beijing </answer>. Question: ${question}`;
}

export function directProtocol(opts: { instruction?: (question: string) => string; envRole?: 'user' | 'tool' } = {}): EpisodeProtocol {
  const role = opts.envRole ?? 'user';
  return {
    name: 'direct',
    injection: 'chat',
    stopStrings: ['</answer>'],
    initialMessages(question): ChatMessage[] {
      return [{ role: 'user', content: (opts.instruction ?? directInstruction)(question) }];
    },
    parse(text) {
      const r = scanBlocks(text, [{ tag: 'answer' }]);
      if (r.found) return { kind: 'answer', answer: r.content.trim(), end: r.end };
      return r.open ? { kind: 'none', reason: 'unclosed', open: r.open } : { kind: 'none', reason: 'no_action' };
    },
    async respond() {
      return { messages: [{ role, content: 'No answer found. Give the answer between <answer> and </answer>.' }], calls: [], toolMs: 0 };
    },
  };
}
