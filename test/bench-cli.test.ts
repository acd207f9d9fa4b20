// `slm-train bench retrieval --quick`: the JSON and markdown it writes (figures are not asserted —
// tests never assert timings — only that each is measured, finite and beside its limit).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { runCliAsync } from './helpers/cli.js';

t.test('bench retrieval --quick --out: JSON with the serve-retriever load test beside the in-process rate, and the table', async (t) => {
  const dir = t.testdir();
  const out = join(dir, 'bench.json');
  const r = await runCliAsync(['bench', 'retrieval', '--quick', '--out', out], { timeout: 300_000 });
  t.equal(r.code, 0, r.stderr.slice(-2000));
  const doc = JSON.parse(readFileSync(out, 'utf8'));
  t.match(doc, { quick: true, machine: /cores/, seconds: { retrieval: Number, total: Number } });
  const s = doc.reports.retrieval.serve_retriever;
  t.ok(s.in_process_searches_per_s > 0, 'the limit, measured in the same run');
  t.same(s.levels.map((l: { clients: number }) => l.clients), [1, 8, 64]);
  for (const l of s.levels) {
    t.ok(l.requests_per_s > 0 && l.n > 0 && l.p99_ms >= l.p50_ms, `${l.clients} clients: ${l.requests_per_s} requests/s, p50 ${l.p50_ms} ms, p99 ${l.p99_ms} ms`);
    t.equal(l.errors, 0);
  }
  const md = readFileSync(join(dir, 'bench.md'), 'utf8');
  t.match(md, /the benchmarks took retrieval [\d.]+ s; total [\d.]+ s/);
  t.match(md, /\| concurrent clients \| requests\/s \| p50 ms \| p99 ms \| errors \|/);
  t.equal(r.stdout.trim(), md.trim(), 'stdout is the table');
});
