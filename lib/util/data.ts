/** Small helpers shared by the data readers (corpus, questions, SFT rows) and the seeded generators. */
import { SlmError } from '../errors.js';

/**
 * The rows of a JSONL text: one JSON value per non-blank line; a line that does not parse is an
 * error `code` naming the file and the line.
 */
export function parseJsonLines(text: string, file: string, code: string): unknown[] {
  return text
    .split('\n')
    .map((l, i) => [l, i] as const)
    .filter(([l]) => l.trim())
    .map(([l, i]) => {
      try {
        return JSON.parse(l);
      } catch (e) {
        throw new SlmError(code, `${file}:${i + 1}: not valid JSON (${(e as Error).message}).`);
      }
    });
}

/** Marsaglia's xorshift32 from a 32-bit state (a state of 0 stays 0): uniforms in [0, 1). */
export function xorshift32(state: number): () => number {
  let s = state >>> 0;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 4294967296;
  };
}
