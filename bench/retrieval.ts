/**
 * `slm-train bench retrieval`: on a generated corpus of 5,000 pages (20,000 chunks; --quick: 1,000
 * pages), the index build time (embedding + HNSW graph, beside the embedding alone), query latency
 * p50/p99 for HNSW dense search, exact dense search (the reference it approximates), BM25 and the
 * hybrid, and HNSW recall@10 against exact search for several ef (a neighbour counts when its score is
 * within 1e-3 of the 10th exact one, ann-benchmarks' convention, so ties at the cut are not misses),
 * and a load test of `slm-train serve-retriever` over the same index (bench/retriever-server.ts).
 * Issue 19's targets are printed beside the figures (BM25 search_pages p50 <= 1 ms, hybrid <= 2 ms,
 * serve-retriever >= 500 requests/s at 8 clients), with the BM25 of before issue 19
 * (bench/bm25-before.ts) timed through the same search_pages in the same run, and the hybrid's time
 * split into its parts (query embedding, HNSW, BM25, page ranking and fusion).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex, chunkPages, DEFAULT_PARAMS } from '../lib/retrieval/index.js';
import { HashingEmbedder } from '../lib/retrieval/embedders.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { loadTest } from './retriever-server.js';
import { BM25Before } from './bm25-before.js';
import { BM25 } from '../lib/retrieval/bm25.js';
import { summarize, type Latency } from './sandbox.js';
import type { BenchOptions, BenchReport } from './types.js';

const EFS = [16, 32, 64, 128, 256, 512];

async function latency(queries: string[], f: (q: string) => Promise<unknown>): Promise<Latency> {
  for (const q of queries.slice(0, 20)) await f(q); // warm-up (the JIT), not measured
  const ms: number[] = [];
  for (const q of queries) {
    const t0 = performance.now();
    await f(q);
    ms.push(performance.now() - t0);
  }
  return summarize(ms);
}

export async function runBench(o: BenchOptions = {}): Promise<BenchReport> {
  const log = o.log ?? (() => {});
  const pages = o.quick ? 1000 : 5000;
  const gen = syntheticCorpus({ pages, seed: 7 });
  const corpus = new Corpus(gen.pages);
  const chunks = chunkPages(corpus, DEFAULT_PARAMS.chunkWords);
  let t0 = performance.now();
  await new HashingEmbedder().embed(
    chunks.map((c) => c.text),
    'document',
  );
  const embedS = (performance.now() - t0) / 1e3;
  log(`retrieval: ${pages} pages, ${chunks.length} chunks; building the index`);
  t0 = performance.now();
  const idx = await SearchIndex.build(corpus, { kind: 'hybrid' });
  const buildS = (performance.now() - t0) / 1e3;
  const step = Math.max(1, Math.floor(gen.questions.length / (o.quick ? 100 : 300)));
  const queries = gen.questions.filter((_, i) => i % step === 0).map((q) => q.question);
  const exact = await Promise.all(queries.map((q) => idx.denseChunks(q, 10, true)));
  const recall: Record<string, { recall_at_10: number; p50_ms: number; p99_ms: number }> = {};
  for (const ef of EFS) {
    idx.setEf(ef);
    let hit = 0;
    const ms: number[] = [];
    for (let i = 0; i < queries.length; i++) {
      const t = performance.now();
      const a = await idx.denseChunks(queries[i], 10);
      ms.push(performance.now() - t);
      const cut = exact[i][9].score - 1e-3;
      hit += a.filter((x) => x.score >= cut).length;
    }
    const l = summarize(ms);
    recall[ef] = { recall_at_10: +(hit / (queries.length * 10)).toFixed(4), p50_ms: l.p50_ms, p99_ms: l.p99_ms };
    log(`retrieval: ef ${ef}: recall@10 ${recall[ef].recall_at_10}`);
  }
  idx.setEf(DEFAULT_PARAMS.ef);
  const lat = {
    hnsw_dense: await latency(queries, (q) => idx.denseChunks(q, 10)),
    exact_dense: await latency(queries, (q) => idx.denseChunks(q, 10, true)),
    bm25_pages: await latency(queries, (q) => idx.searchPages(q, 10, 'bm25')),
    hybrid_pages: await latency(queries, (q) => idx.searchPages(q, 10, 'hybrid')),
  };
  // Where the hybrid's time goes: its parts, each timed alone over the same queries (pool 50).
  const embedder = new HashingEmbedder();
  const hybridParts = {
    embed_query: await latency(queries, (q) => embedder.embed([q], 'query')),
    hnsw_top50: await latency(queries, (q) => idx.denseChunks(q, 50)), // embeds the query too
    bm25_top50: await latency(queries, async (q) => idx.lexical.search(q, 50)),
  };
  // The BM25 of before issue 19, through the same search_pages; its answers must be the same.
  const now = idx.lexical;
  const mine = await Promise.all(queries.map(async (q) => [await idx.searchPages(q, 10, 'bm25'), await idx.searchPages(q, 10, 'hybrid')]));
  t0 = performance.now();
  idx.lexical = new BM25Before(chunks.map((c) => c.text));
  const bm25BeforeBuildS = (performance.now() - t0) / 1e3;
  const before = {
    bm25_pages: await latency(queries, (q) => idx.searchPages(q, 10, 'bm25')),
    hybrid_pages: await latency(queries, (q) => idx.searchPages(q, 10, 'hybrid')),
  };
  let same = 0;
  for (let i = 0; i < queries.length; i++)
    if (
      JSON.stringify([await idx.searchPages(queries[i], 10, 'bm25'), await idx.searchPages(queries[i], 10, 'hybrid')]) ===
      JSON.stringify(mine[i])
    )
      same++;
  idx.lexical = now;
  t0 = performance.now();
  new BM25(chunks.map((c) => c.text));
  const bm25BuildS = (performance.now() - t0) / 1e3;
  log(
    `retrieval: BM25 search_pages p50 ${lat.bm25_pages.p50_ms} ms (before issue 19: ${before.bm25_pages.p50_ms} ms), hybrid ${lat.hybrid_pages.p50_ms} ms (before: ${before.hybrid_pages.p50_ms} ms); same answers ${same}/${queries.length}`,
  );
  // The server in its own process over the saved index; the limit beside it is the in-process rate.
  const passages = await latency(queries, (q) => idx.searchPassages(q, 3));
  const dir = mkdtempSync(join(tmpdir(), 'slm-bench-index-'));
  let server: Awaited<ReturnType<typeof loadTest>>;
  try {
    idx.save(dir);
    server = await loadTest(dir, queries, { levels: [1, 8, 64], seconds: o.quick ? 1.5 : 5, log });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const inProcessRate = +(1000 / passages.mean_ms).toFixed(1);
  const targets = { bm25_pages_p50_ms: 1, hybrid_pages_p50_ms: 2, serve_retriever_8_clients_requests_per_s: 500 };
  const results = {
    serve_retriever: { in_process_passages: passages, in_process_searches_per_s: inProcessRate, levels: server },
    targets,
    before_issue_19: { ...before, bm25_build_s: +bm25BeforeBuildS.toFixed(3), same_answers: same },
    bm25_build_s: +bm25BuildS.toFixed(3),
    hybrid_parts: hybridParts,
    pages,
    chunks: chunks.length,
    queries: queries.length,
    M: DEFAULT_PARAMS.M,
    ef_construction: DEFAULT_PARAMS.efConstruction,
    default_ef: DEFAULT_PARAMS.ef,
    build_s: +buildS.toFixed(2),
    embed_only_s: +embedS.toFixed(2),
    latency: lat,
    recall,
  };
  const f = (x: number) => x.toFixed(2);
  const at8 = server.find((l) => l.clients === 8);
  const table = [
    `Retrieval: ${pages} generated pages, ${chunks.length} chunks, hashing-256 embedder, HNSW M ${DEFAULT_PARAMS.M} / efConstruction ${DEFAULT_PARAMS.efConstruction}; ${queries.length} queries`,
    '',
    '| case | p50 ms | p99 ms | target p50 | BM25 before issue 19, same run: p50 / p99 ms |',
    '|---|---:|---:|---:|---:|',
    `| index build (embed + HNSW + BM25) | ${f(buildS * 1e3)} (embedding alone ${f(embedS * 1e3)}, BM25 alone ${f(bm25BuildS * 1e3)}) | | | BM25 alone ${f(bm25BeforeBuildS * 1e3)} |`,
    `| dense top-10, HNSW ef ${DEFAULT_PARAMS.ef} | ${f(lat.hnsw_dense.p50_ms)} | ${f(lat.hnsw_dense.p99_ms)} | | |`,
    `| dense top-10, exact (the reference) | ${f(lat.exact_dense.p50_ms)} | ${f(lat.exact_dense.p99_ms)} | | |`,
    `| search_pages, BM25 | ${f(lat.bm25_pages.p50_ms)} | ${f(lat.bm25_pages.p99_ms)} | ≤ ${targets.bm25_pages_p50_ms} | ${f(before.bm25_pages.p50_ms)} / ${f(before.bm25_pages.p99_ms)} |`,
    `| search_pages, hybrid | ${f(lat.hybrid_pages.p50_ms)} | ${f(lat.hybrid_pages.p99_ms)} | ≤ ${targets.hybrid_pages_p50_ms} | ${f(before.hybrid_pages.p50_ms)} / ${f(before.hybrid_pages.p99_ms)} |`,
    `| hybrid's parts: embed the query / embed + HNSW top-50 / BM25 top-50 | ${f(hybridParts.embed_query.p50_ms)} / ${f(hybridParts.hnsw_top50.p50_ms)} / ${f(hybridParts.bm25_top50.p50_ms)} | ${f(hybridParts.embed_query.p99_ms)} / ${f(hybridParts.hnsw_top50.p99_ms)} / ${f(hybridParts.bm25_top50.p99_ms)} | | |`,
    '',
    `Same search_pages answers (BM25 and hybrid) with the BM25 of before issue 19: ${same} of ${queries.length} queries.`,
    '',
    '| HNSW ef | recall@10 vs exact | p50 ms | p99 ms |',
    '|---:|---:|---:|---:|',
    ...EFS.map((ef) => `| ${ef} | ${recall[ef].recall_at_10.toFixed(4)} | ${f(recall[ef].p50_ms)} | ${f(recall[ef].p99_ms)} |`),
    '',
    `slm-train serve-retriever (own process, one-query POST /retrieve, top-3 hybrid passages, keep-alive clients); the limit: ${inProcessRate} searches/s in process (p50 ${f(passages.p50_ms)} ms); target at 8 clients: ≥ ${targets.serve_retriever_8_clients_requests_per_s} requests/s${at8 ? ` (measured ${at8.requests_per_s})` : ''}`,
    '',
    '| concurrent clients | requests/s | p50 ms | p99 ms | errors |',
    '|---:|---:|---:|---:|---:|',
    ...server.map((l) => `| ${l.clients} | ${l.requests_per_s} | ${f(l.p50_ms)} | ${f(l.p99_ms)} | ${l.errors} |`),
  ].join('\n');
  return { kind: 'retrieval', results, table };
}
