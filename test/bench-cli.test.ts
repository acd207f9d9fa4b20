// `slm-train bench retrieval --quick`: the JSON and markdown it writes (figures are not asserted —
// tests never assert timings — only that each is measured, finite and beside its limit).
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { runCliAsync } from './helpers/cli.js';
import { native } from '../lib/engine/runtime.js';

t.test('bench retrieval --quick --out: JSON with the serve-retriever load test beside the in-process rate, and the table', async (t) => {
  const dir = t.testdir();
  const out = join(dir, 'bench.json');
  const readme = join(dir, 'README.md');
  writeFileSync(readme, '# x\n\nbefore\n\n<!-- bench -->\nold tables\n<!-- /bench -->\n\nafter\n');
  // Run as on an AVX2-only CPU (README: "The whole suite also runs capped"): the report says what ran.
  const caps = { SLM_TRAIN_CPU_ISA: 'avx2', ATEN_CPU_CAPABILITY: 'avx2', OPENBLAS_CORETYPE: 'HASWELL' };
  const r = await runCliAsync(['bench', 'retrieval', '--quick', '--out', out, '--readme', readme], { timeout: 300_000, env: caps });
  t.equal(r.code, 0, r.stderr.slice(-2000));
  const doc = JSON.parse(readFileSync(out, 'utf8'));
  t.match(doc, { quick: true, machine: /cores/, seconds: { retrieval: Number, total: Number } });
  const detected = native().version().cpuIsaDetected;
  const level = detected === 'none' ? 'none' : 'avx2';
  t.same(
    doc.software,
    // (a CPU without AVX2 runs ATen's DEFAULT code whatever the cap asks)
    { kernels: level, detected, aten: level === 'none' ? 'DEFAULT' : 'AVX2', openblas_coretype: 'HASWELL', cap: 'avx2' },
    'the JSON names the kernels, ATen and OpenBLAS levels the run had',
  );
  const s = doc.reports.retrieval.serve_retriever;
  t.ok(s.in_process_searches_per_s > 0, 'the limit, measured in the same run');
  t.same(
    s.levels.map((l: { clients: number }) => l.clients),
    [1, 8, 64],
  );
  for (const l of s.levels) {
    t.ok(
      l.requests_per_s > 0 && l.n > 0 && l.p99_ms >= l.p50_ms,
      `${l.clients} clients: ${l.requests_per_s} requests/s, p50 ${l.p50_ms} ms, p99 ${l.p99_ms} ms`,
    );
    t.equal(l.errors, 0);
  }
  const md = readFileSync(join(dir, 'bench.md'), 'utf8');
  t.match(md, /the benchmarks took retrieval [\d.]+ s; total [\d.]+ s/);
  const head = md.split('\n')[0];
  t.ok(
    head.includes(
      `; CPU kernels ${level}${level === detected ? '' : ` (SLM_TRAIN_CPU_ISA=avx2; the CPU has ${detected})`}, ATen ${doc.software.aten}, OpenBLAS HASWELL (--quick);`,
    ),
    `the table's header says so too: ${head}`,
  );
  t.match(md, /\| concurrent clients \| requests\/s \| p50 ms \| p99 ms \| errors \|/);
  t.equal(r.stdout.trim(), md.trim(), 'stdout is the table');
  t.equal(
    readFileSync(readme, 'utf8'),
    `# x\n\nbefore\n\n<!-- bench -->\n${md.trim()}\n<!-- /bench -->\n\nafter\n`,
    '--readme replaced the block between the markers, nothing else',
  );
});

t.test('bench --readme on a file without the markers fails at once with a code, before any benchmark', async (t) => {
  const dir = t.testdir({ 'README.md': '# no markers\n' });
  const r = await runCliAsync(['bench', 'rollout', '--quick', '--readme', join(dir, 'README.md')], { timeout: 60_000 });
  t.equal(r.code, 2);
  t.match(
    r.stderr,
    /ARGUMENT_INVALID.*<!-- bench:[a-z0-9-]+ -->.*<!-- \/bench:[a-z0-9-]+ -->.*<!-- bench -->.*<!-- \/bench -->.*found no <!-- bench:[a-z0-9-]+ -->/,
  );
  t.notMatch(r.stderr, /\[bench\]/, 'no benchmark ran');
  t.equal(readFileSync(join(dir, 'README.md'), 'utf8'), '# no markers\n', 'the file is untouched');
});

// A README keeps one block per kind of CPU: a run writes the block of its kernels' level
// (doctor's 'CPU kernels'), and leaves the other kinds' blocks and the plain one alone.
t.test('bench --readme writes the block of this CPU kind when the file has one', async (t) => {
  const level = native().version().cpuIsa;
  const other = level === 'avx2' ? 'avx512-bf16' : 'avx2';
  const dir = t.testdir();
  const readme = join(dir, 'README.md');
  const text = `# x\n<!-- bench -->\nplain\n<!-- /bench -->\n<!-- bench:${other} -->\nother kind\n<!-- /bench:${other} -->\n<!-- bench:${level} -->\nold\n<!-- /bench:${level} -->\n`;
  writeFileSync(readme, text);
  const r = await runCliAsync(['bench', 'retrieval', '--quick', '--readme', readme], { timeout: 300_000 });
  t.equal(r.code, 0, r.stderr.slice(-2000));
  t.equal(readFileSync(readme, 'utf8'), text.replace('\nold\n', `\n${r.stdout.trim()}\n`), `only the ${level} block changed`);
});
