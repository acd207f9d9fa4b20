/**
 * A small byte-level BPE tokenizer learned from the demo's own texts, written as a Hugging Face
 * `tokenizer.json` (GPT-2 pre-tokenization and byte-to-unicode alphabet, as Qwen's): a few hundred
 * ids instead of Qwen3's 151,669, so that the tiny demo model's output layer is small and it trains
 * in minutes. Training is the classic greedy algorithm (count adjacent pairs inside pre-tokenized
 * words, merge the most frequent, repeat); no JavaScript library trains tokenizers, and the file it
 * writes is read back by the same loader as any Hugging Face tokenizer (lib/model/tokenizer.ts).
 */
import { byteLevelDecodeTable } from '../model/tokenizer.js';

/** GPT-2's pre-tokenization pattern (what ByteLevel with use_regex applies). */
const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

export interface BpeOptions {
  /** Merges to learn (the vocabulary is 256 bytes + merges + added tokens). */
  merges: number;
  /** Special tokens (chat markers, end of text), added after the vocabulary in order. */
  special: string[];
  /** Non-special added tokens (e.g. protocol tags), matched whole before pre-tokenization. */
  added?: string[];
  /** Pairs seen fewer times than this are not merged (default 2). */
  minFrequency?: number;
}

function byteEncoder(): string[] {
  const enc: string[] = new Array(256);
  for (const [cp, b] of byteLevelDecodeTable()) enc[b] = String.fromCodePoint(cp);
  return enc;
}

/** Learns merges from `texts` and returns the tokenizer.json object. */
export function trainByteLevelBpe(texts: readonly string[], opts: BpeOptions): Record<string, unknown> {
  const enc = byteEncoder();
  const utf8 = new TextEncoder();
  const addedAll = [...opts.special, ...(opts.added ?? [])];
  const splitAdded = addedAll.length ? new RegExp(addedAll.map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'g') : null;
  // Word -> frequency, each word as its byte symbols.
  const freq = new Map<string, number>();
  for (const t of texts) {
    for (const part of splitAdded ? t.split(splitAdded) : [t]) {
      for (const m of part.matchAll(GPT2_SPLIT)) {
        const w = Array.from(utf8.encode(m[0]), (b) => enc[b]).join('');
        freq.set(w, (freq.get(w) ?? 0) + 1);
      }
    }
  }
  const words = [...freq].map(([w, n]) => ({ syms: Array.from(w), n }));
  const vocab = new Map<string, number>();
  for (let b = 0; b < 256; b++) vocab.set(enc[b], b);
  const merges: string[] = [];
  const minFreq = opts.minFrequency ?? 2;
  for (let k = 0; k < opts.merges; k++) {
    const pairs = new Map<string, number>();
    for (const w of words)
      for (let i = 0; i + 1 < w.syms.length; i++) {
        const p = `${w.syms[i]} ${w.syms[i + 1]}`;
        pairs.set(p, (pairs.get(p) ?? 0) + w.n);
      }
    let best = '';
    let bestN = 0;
    for (const [p, n] of pairs) if (n > bestN || (n === bestN && p < best)) [best, bestN] = [p, n];
    if (bestN < minFreq) break;
    const [a, b] = best.split(' ');
    const ab = a + b;
    merges.push(best);
    if (!vocab.has(ab)) vocab.set(ab, vocab.size);
    for (const w of words) {
      if (w.syms.length < 2) continue;
      const out: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
          out.push(ab);
          i++;
        } else out.push(w.syms[i]);
      }
      w.syms = out;
    }
  }
  const added = addedAll.map((content, i) => ({
    id: vocab.size + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: i < opts.special.length,
  }));
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab: Object.fromEntries(vocab),
      merges,
    },
  };
}
