/**
 * Okapi BM25 over a set of documents (k1 1.2, b 0.75 by default), laid out as a search engine lays
 * out its inverted index: term ids, and per term a run of postings in typed arrays (doc ids
 * ascending, and each posting's score, which depends only on the term's idf, the term frequency and
 * the document's length norm, so it is computed once at build). A query deduplicates its words, adds
 * the postings' scores into a per-document accumulator (remembering which documents it touched), and
 * keeps the best k in a bounded heap instead of sorting every hit.
 *
 * Each posting's score is computed with the same floating-point expression, and a document's scores
 * are added in the same order (query words in first-occurrence order), as in the straightforward
 * Map-and-sort version this replaces, so scores are bit-identical to it; ties are broken by the lower
 * document index, as before.
 */
import { SlmError } from '../errors.js';
import { words } from './text.js';

export class BM25 {
  private ids = new Map<string, number>(); // term -> term id
  private offsets: Int32Array; // postings of term t: [offsets[t], offsets[t + 1])
  private docs: Int32Array;
  private weights: Float64Array; // each posting's score: idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))
  private idfs: Float64Array;
  private lengths: Int32Array;
  private avgdl = 0;
  // Per-query scratch (searches are synchronous, so one set serves every query).
  private acc: Float64Array;
  private touched: Int32Array;

  constructor(
    docs: string[],
    readonly k1 = 1.2,
    readonly b = 0.75,
  ) {
    // Every posting's score must be > 0: the accumulator takes 0 for "not touched yet".
    if (!(k1 >= 0 && b >= 0 && b <= 1))
      throw new SlmError('ARGUMENT_INVALID', `BM25 expects k1 >= 0 and 0 <= b <= 1, found k1 ${k1}, b ${b}.`);
    const n = docs.length;
    this.lengths = new Int32Array(n);
    let cap = 1 << 16;
    let pTerm = new Int32Array(cap);
    let pDoc = new Int32Array(cap);
    let pTf = new Int32Array(cap);
    let np = 0;
    const df: number[] = [];
    let total = 0;
    for (let i = 0; i < n; i++) {
      const w = words(docs[i]);
      this.lengths[i] = w.length;
      total += w.length;
      const tf = new Map<string, number>();
      for (const t of w) tf.set(t, (tf.get(t) ?? 0) + 1);
      for (const [t, c] of tf) {
        let id = this.ids.get(t);
        if (id === undefined) {
          id = df.length;
          this.ids.set(t, id);
          df.push(0);
        }
        df[id]++;
        if (np === cap) {
          cap *= 2;
          const grow = (a: Int32Array) => {
            const g = new Int32Array(cap);
            g.set(a);
            return g;
          };
          pTerm = grow(pTerm);
          pDoc = grow(pDoc);
          pTf = grow(pTf);
        }
        pTerm[np] = id;
        pDoc[np] = i;
        pTf[np] = c;
        np++;
      }
    }
    const T = df.length;
    this.offsets = new Int32Array(T + 1);
    for (let t = 0; t < T; t++) this.offsets[t + 1] = this.offsets[t] + df[t];
    this.avgdl = total / Math.max(1, n);
    this.idfs = new Float64Array(T);
    for (let t = 0; t < T; t++) this.idfs[t] = BM25.idfOf(n, df[t]);
    const norms = new Float64Array(n);
    for (let d = 0; d < n; d++) norms[d] = this.k1 * (1 - this.b + (this.b * this.lengths[d]) / this.avgdl);
    // Counting sort by term; documents were visited in order, so each term's doc ids stay ascending.
    this.docs = new Int32Array(np);
    this.weights = new Float64Array(np);
    const at = this.offsets.slice(0, T);
    const kp1 = this.k1 + 1;
    for (let j = 0; j < np; j++) {
      const t = pTerm[j];
      const p = at[t]++;
      const d = pDoc[j];
      const tf = pTf[j];
      this.docs[p] = d;
      // The same expression, evaluated in the same order, as the straightforward version's.
      this.weights[p] = (this.idfs[t] * tf * kp1) / (tf + norms[d]);
    }
    this.acc = new Float64Array(n);
    this.touched = new Int32Array(n);
  }

  get size(): number {
    return this.lengths.length;
  }

  /** Lucene/rank_bm25's idf for a term in `df` of `n` documents. */
  private static idfOf(n: number, df: number): number {
    return Math.log(1 + (n - df + 0.5) / (df + 0.5));
  }

  /** idf as Lucene/rank_bm25: ln(1 + (N - n + 0.5) / (n + 0.5)). */
  idf(term: string): number {
    const id = this.ids.get(term);
    return id === undefined ? BM25.idfOf(this.size, 0) : this.idfs[id];
  }

  /** The k best documents for a query, best first (ties: lower document index first). */
  search(query: string, k: number): Array<{ doc: number; score: number }> {
    const { acc, touched, docs, weights } = this;
    let nt = 0;
    for (const t of new Set(words(query))) {
      const id = this.ids.get(t);
      if (id === undefined) continue;
      for (let p = this.offsets[id], end = this.offsets[id + 1]; p < end; p++) {
        const d = docs[p];
        // Every posting's score is > 0, so a zero accumulator means "not touched yet".
        const a = acc[d];
        if (a === 0) touched[nt++] = d;
        acc[d] = a + weights[p];
      }
    }
    // When most documents were touched (common words), reading the accumulator in order beats
    // following the touched list.
    const dense = nt * 4 > acc.length;
    const top = topK(acc, dense ? null : touched, dense ? acc.length : nt, Math.max(0, Math.floor(k)));
    if (dense) acc.fill(0);
    else for (let i = 0; i < nt; i++) acc[touched[i]] = 0;
    return top;
  }
}

/**
 * The best `k` of the documents `ids[0..n)` (or, without `ids`, of the documents 0..n-1 whose score
 * is not 0) by `score[doc]` (higher first, ties: lower doc first), by a bounded min-heap whose root
 * is the worst kept document.
 */
function topK(score: Float64Array, ids: Int32Array | null, n: number, k: number): Array<{ doc: number; score: number }> {
  if (k === 0 || n === 0) return [];
  const m = Math.min(k, n);
  const hd = new Int32Array(m);
  const hs = new Float64Array(m);
  // a is worse than b: lower score, or the same score and a higher doc.
  const worse = (sa: number, da: number, sb: number, db: number) => sa < sb || (sa === sb && da > db);
  const siftDown = (i: number, size: number) => {
    const d0 = hd[i];
    const s0 = hs[i];
    for (;;) {
      let c = 2 * i + 1;
      if (c >= size) break;
      if (c + 1 < size && worse(hs[c + 1], hd[c + 1], hs[c], hd[c])) c++;
      if (!worse(hs[c], hd[c], s0, d0)) break;
      hd[i] = hd[c];
      hs[i] = hs[c];
      i = c;
    }
    hd[i] = d0;
    hs[i] = s0;
  };
  let size = 0;
  for (let j = 0; j < n; j++) {
    const d = ids ? ids[j] : j;
    const s = score[d];
    if (s === 0) continue; // (only without ids: an untouched document)
    if (size < m) {
      // sift up
      let i = size++;
      while (i > 0) {
        const parent = (i - 1) >> 1;
        if (!worse(s, d, hs[parent], hd[parent])) break;
        hd[i] = hd[parent];
        hs[i] = hs[parent];
        i = parent;
      }
      hd[i] = d;
      hs[i] = s;
    } else if (worse(hs[0], hd[0], s, d)) {
      hd[0] = d;
      hs[0] = s;
      siftDown(0, size);
    }
  }
  // Pop the worst to the back: the array ends sorted best first.
  const out = new Array<{ doc: number; score: number }>(size);
  for (let end = size - 1; end >= 0; end--) {
    out[end] = { doc: hd[0], score: hs[0] };
    hd[0] = hd[end];
    hs[0] = hs[end];
    siftDown(0, end);
  }
  return out;
}

/** Reciprocal-rank fusion of ranked lists of keys: score = sum over lists of 1 / (k + rank). */
export function reciprocalRankFusion(lists: string[][], k = 60): Array<{ key: string; score: number }> {
  const s = new Map<string, number>();
  for (const l of lists) l.forEach((key, r) => s.set(key, (s.get(key) ?? 0) + 1 / (k + r + 1)));
  return [...s].map(([key, score]) => ({ key, score })).sort((a, b) => b.score - a.score || a.key.localeCompare(b.key));
}
