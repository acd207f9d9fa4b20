// BM25's typed-array index (issue 19) against two other computations on random corpora: a
// straightforward one written here from the textbook formula (scores within 1e-9 relative, the same
// order, ties by lower document index), and the Map-and-sort version it replaced (bench/bm25-before.ts),
// whose scores it must reproduce bit for bit. And search_pages over the index against a page ranking
// computed here from those scores.
import t from 'tap';
import { BM25 } from '../lib/retrieval/bm25.js';
import { BM25Before } from '../bench/bm25-before.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { xorshift32 } from '../lib/util/data.js';

/** Textbook Okapi BM25 with Lucene's idf: every document scored, all hits sorted (higher first, then lower doc). */
function reference(docs: string[], k1 = 1.2, b = 0.75): (query: string, k: number) => Array<{ doc: number; score: number }> {
  const tok = (s: string) => s.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
  const toks = docs.map(tok);
  const N = toks.length;
  const avgdl = toks.reduce((a, w) => a + w.length, 0) / Math.max(1, N);
  const df = new Map<string, number>();
  for (const w of toks) for (const x of new Set(w)) df.set(x, (df.get(x) ?? 0) + 1);
  return (query, k) => {
    const qterms: string[] = [];
    for (const w of tok(query)) if (!qterms.includes(w)) qterms.push(w);
    const out: Array<{ doc: number; score: number }> = [];
    toks.forEach((w, d) => {
      let score = 0;
      let any = false;
      for (const q of qterms) {
        const tf = w.filter((x) => x === q).length;
        if (!tf) continue;
        any = true;
        const n = df.get(q)!;
        const idf = Math.log(1 + (N - n + 0.5) / (n + 0.5));
        score += idf * ((tf * (k1 + 1)) / (tf + k1 * (1 - b + b * (w.length / avgdl))));
      }
      if (any) out.push({ doc: d, score });
    });
    out.sort((x, y) => y.score - x.score || x.doc - y.doc);
    return out.slice(0, k);
  };
}

/** A random corpus with a skewed vocabulary (a few very common words, many rare ones), empty and duplicated documents. */
function randomCorpus(seed: number, nDocs: number, vocab: number): { docs: string[]; queries: string[] } {
  const r = xorshift32(seed);
  const word = () => `w${Math.floor(vocab * r() ** 3)}`; // w0 is the commonest
  const docs: string[] = [];
  for (let i = 0; i < nDocs; i++) {
    const x = r();
    if (x < 0.02) docs.push('');
    else if (x < 0.1 && docs.length)
      docs.push(docs[Math.floor(r() * docs.length)]); // exact ties
    else docs.push(Array.from({ length: 1 + Math.floor(r() * 40) }, word).join(r() < 0.5 ? ' ' : ', '));
  }
  const queries: string[] = [];
  for (let i = 0; i < 60; i++) {
    const n = 1 + Math.floor(r() * 6);
    const q = Array.from({ length: n }, () => (r() < 0.1 ? 'zzz' : word()));
    if (r() < 0.3) q.push(q[0]); // a repeated word counts once
    queries.push(q.map((w) => (r() < 0.2 ? w.toUpperCase() : w)).join(r() < 0.5 ? ' ' : '? '));
  }
  return { docs, queries };
}

t.test('BM25 matches the textbook computation: order (ties: lower doc first) and scores within 1e-9', async (t) => {
  for (const seed of [1, 2, 3]) {
    const { docs, queries } = randomCorpus(seed * 7919, 600, 300);
    const bm = new BM25(docs);
    const ref = reference(docs);
    let compared = 0;
    let ties = 0;
    for (const q of queries)
      for (const k of [1, 10, 50, 10000]) {
        const got = bm.search(q, k);
        const want = ref(q, k);
        if (got.length !== want.length || got.some((g, i) => g.doc !== want[i].doc)) {
          t.same(
            got.map((g) => g.doc),
            want.map((w) => w.doc),
            `seed ${seed}, ${JSON.stringify(q)}, k ${k}: order`,
          );
          continue;
        }
        for (let i = 0; i < got.length; i++) {
          if (Math.abs(got[i].score - want[i].score) > 1e-9 * Math.abs(want[i].score))
            t.fail(`seed ${seed}, ${JSON.stringify(q)}: doc ${got[i].doc} ${got[i].score} vs ${want[i].score}`);
          if (i && want[i].score === want[i - 1].score) ties++;
        }
        compared += got.length;
      }
    t.ok(compared > 10000, `seed ${seed}: ${compared} hits compared`);
    t.ok(ties > 100, `seed ${seed}: ${ties} exact ties among them, ordered by document index`);
  }
});

t.test('BM25 scores are bit-identical to the Map-and-sort version it replaced', async (t) => {
  for (const seed of [11, 12]) {
    const { docs, queries } = randomCorpus(seed, 2000, 2000);
    const now = new BM25(docs);
    const before = new BM25Before(docs);
    for (const q of queries) {
      for (const k of [3, 50, 1e9]) t.same(now.search(q, k), before.search(q, k), `seed ${seed}, ${JSON.stringify(q)}, k ${k}`);
      for (const w of q.toLowerCase().split(/\W+/)) t.equal(now.idf(w), before.idf(w), `idf(${w})`);
    }
  }
  const edge = new BM25(['', 'a b', 'a']);
  t.same(edge.search('a', 10), new BM25Before(['', 'a b', 'a']).search('a', 10), 'empty documents');
  t.same(edge.search('a', 0), [], 'k 0');
  t.same(edge.search('nothing here', 5), [], 'no shared word');
  t.same(new BM25([]).search('a', 5), [], 'no documents');
});

t.test('queries do not leak into each other (the accumulator is cleared)', async (t) => {
  const { docs, queries } = randomCorpus(5, 800, 400);
  const bm = new BM25(docs);
  const first = queries.map((q) => bm.search(q, 20));
  const again = [...queries]
    .reverse()
    .map((q) => bm.search(q, 20))
    .reverse();
  t.same(again, first);
});

t.test('search_pages (bm25): the pages of the best 50 chunks by their best chunk, as computed here', async (t) => {
  const gen = syntheticCorpus({ pages: 200, seed: 5 });
  const idx = await SearchIndex.build(new Corpus(gen.pages), { kind: 'bm25' });
  const ref = reference(idx.chunks.map((c) => c.text));
  for (const q of gen.questions.filter((_, i) => i % 37 === 0).map((x) => x.question)) {
    const best = new Map<number, number>();
    for (const h of ref(q, 50)) {
      const p = idx.chunks[h.doc].page;
      if (!best.has(p) || best.get(p)! < h.score) best.set(p, h.score);
    }
    const want = [...best].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, 10);
    const got = await idx.searchPages(q, 10, 'bm25');
    t.same(
      got.map((h) => [h.page_id, h.similarity]),
      want.map(([p, s]) => [gen.pages[p].id, +s.toFixed(4)]),
      q,
    );
  }
});
