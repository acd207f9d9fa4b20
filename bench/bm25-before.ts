/**
 * BM25 as lib/retrieval/bm25.ts computed it before issue 19, kept verbatim: postings in a Map of
 * arrays of [doc, tf] pairs, every posting of every query word scored into a Map, all hits sorted.
 * `slm-train bench retrieval` times it beside the typed-array index (the old path's figure, same run),
 * and test/bm25-index.test.ts checks that the new index's scores are bit-identical to these.
 */
import { words } from '../lib/retrieval/text.js';

export class BM25Before {
  private postings = new Map<string, Array<[number, number]>>(); // term -> [(doc, tf)]
  private lengths: number[] = [];
  private avgdl = 0;
  constructor(
    docs: string[],
    readonly k1 = 1.2,
    readonly b = 0.75,
  ) {
    docs.forEach((d, i) => {
      const w = words(d);
      this.lengths.push(w.length);
      const tf = new Map<string, number>();
      for (const t of w) tf.set(t, (tf.get(t) ?? 0) + 1);
      for (const [t, c] of tf) {
        let p = this.postings.get(t);
        if (!p) this.postings.set(t, (p = []));
        p.push([i, c]);
      }
    });
    this.avgdl = this.lengths.reduce((a, x) => a + x, 0) / Math.max(1, this.lengths.length);
  }
  get size(): number {
    return this.lengths.length;
  }
  /** idf as Lucene/rank_bm25: ln(1 + (N - n + 0.5) / (n + 0.5)). */
  idf(term: string): number {
    const n = this.postings.get(term)?.length ?? 0;
    return Math.log(1 + (this.size - n + 0.5) / (n + 0.5));
  }
  search(query: string, k: number): Array<{ doc: number; score: number }> {
    const scores = new Map<number, number>();
    for (const t of new Set(words(query))) {
      const p = this.postings.get(t);
      if (!p) continue;
      const idf = this.idf(t);
      for (const [d, tf] of p) {
        const s = (idf * tf * (this.k1 + 1)) / (tf + this.k1 * (1 - this.b + (this.b * this.lengths[d]) / this.avgdl));
        scores.set(d, (scores.get(d) ?? 0) + s);
      }
    }
    return [...scores]
      .map(([doc, score]) => ({ doc, score }))
      .sort((a, b) => b.score - a.score || a.doc - b.doc)
      .slice(0, k);
  }
}
