/**
 * Embedders turn texts into unit vectors. `hashing` is deterministic and needs nothing (the offline
 * default): signed feature hashing of word unigrams and bigrams, sublinear term frequency, L2
 * normalisation. Qwen3 embedding checkpoints (last-token pooling) plug in through the same interface.
 */
import { fnv1a, words } from './text.js';

export interface Embedder {
  readonly name: string;
  readonly dim: number;
  embed(texts: string[], kind: 'query' | 'document'): Promise<Float32Array[]>;
}

export class HashingEmbedder implements Embedder {
  readonly name: string;
  constructor(readonly dim = 256) {
    this.name = `hashing-${dim}`;
  }
  embedOne(text: string): Float32Array {
    const w = words(text);
    const counts = new Map<string, number>();
    for (let i = 0; i < w.length; i++) {
      counts.set(w[i], (counts.get(w[i]) ?? 0) + 1);
      if (i + 1 < w.length) {
        const b = `${w[i]} ${w[i + 1]}`;
        counts.set(b, (counts.get(b) ?? 0) + 0.5);
      }
    }
    const v = new Float32Array(this.dim);
    for (const [f, c] of counts) {
      const h = fnv1a(f);
      v[h % this.dim] += (h & 0x80000000 ? -1 : 1) * (1 + Math.log(c));
    }
    let n = 0;
    for (const x of v) n += x * x;
    n = Math.sqrt(n) || 1;
    for (let i = 0; i < v.length; i++) v[i] /= n;
    return v;
  }
  async embed(texts: string[], _kind: 'query' | 'document' = 'document'): Promise<Float32Array[]> {
    return texts.map((t) => this.embedOne(t));
  }
}

export function dot(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}
