/**
 * `slm-train bench sandbox`: latency of running one program, p50/p99, for
 * - the warm Python pool (what episodes use), a trivial program and one making three search calls;
 * - a fresh worker per program (wrapper + interpreter start + the runner's capability probe);
 * - a bare `python3 -I -S -c pass` of the real interpreter (and through PATH, which may be a shim):
 *   the floor any spawn-per-program design pays;
 * - the QuickJS sandbox, for comparison.
 * Programs run one after another (latency, not throughput); the search tools are an in-memory fake,
 * so the figures are the sandbox's own cost.
 */
import { spawn } from 'node:child_process';
import { detectIsolation, resolvePython, WORKER_ENV } from '../lib/sandbox/isolation.js';
import { createPythonPool, runPythonOnce } from '../lib/sandbox/python.js';
import { createQuickJSSandbox } from '../lib/sandbox/quickjs.js';
import type { SandboxResult, SearchTools } from '../lib/sandbox/types.js';
import type { BenchOptions, BenchReport } from './types.js';

const TRIVIAL_PY = 'print(1)';
const THREE_CALLS_PY = 'h = search_pages("alpha")\ns = view_sections(h[0]["page_id"])\nprint(len(read_section(s[0]["section_id"])))';
const TRIVIAL_JS = 'console.log(1)';
const THREE_CALLS_JS =
  'const h = search_pages("alpha"); const s = view_sections(h[0].page_id); console.log(read_section(s[0].section_id).length)';

const PAGE = 'Lorem ipsum dolor sit amet. '.repeat(200);
const tools: SearchTools = {
  search_pages: (q) => Array.from({ length: 10 }, (_, i) => ({ page_id: `page_${i}`, title: `${q} ${i}`, similarity: 1 - i / 10 })),
  view_sections: (p) => [
    { section_id: `${p}:intro`, section_name: 'Introduction' },
    { section_id: `${p}:history`, section_name: 'History' },
  ],
  read_section: () => PAGE,
};

export interface Latency {
  n: number;
  p50_ms: number;
  p99_ms: number;
  mean_ms: number;
}

export function summarize(samples: number[]): Latency {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))];
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return { n: s.length, p50_ms: r(q(0.5)), p99_ms: r(q(0.99)), mean_ms: r(s.reduce((a, b) => a + b, 0) / s.length) };
}

// biome-ignore lint/suspicious/noConfusingVoidType: a run returns a sandbox result, or nothing (a bare interpreter start).
async function timeRuns(n: number, run: () => Promise<SandboxResult | void>, check?: (r: SandboxResult) => boolean): Promise<Latency> {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const r = await run();
    samples.push(performance.now() - t0);
    if (r && check && !check(r)) throw new Error(`benchmark program failed: ${JSON.stringify(r).slice(0, 300)}`);
  }
  return summarize(samples);
}

function spawnAndWait(file: string, args: string[], env: NodeJS.ProcessEnv): Promise<void> {
  return new Promise((res, rej) => {
    const p = spawn(file, args, { stdio: 'ignore', env });
    p.once('error', rej);
    p.once('exit', (code) => (code === 0 ? res() : rej(new Error(`${file} exited with ${code}`))));
  });
}

export async function runBench(opts: BenchOptions = {}): Promise<BenchReport> {
  const log = opts.log ?? (() => {});
  const quick = !!opts.quick;
  const nWarm = quick ? 100 : 500;
  const nFresh = quick ? 10 : 40;
  const nBare = quick ? 20 : 100;
  const ok = (expect: string) => (r: SandboxResult) => r.error === null && r.stdout === expect;
  const expectedLen = `${PAGE.length}\n`;

  const isolation = await detectIsolation();
  const python = await resolvePython();
  log(`sandbox bench: isolation ${isolation.level} (${isolation.details})`);

  log(`bare interpreter start x${nBare}`);
  const bare = await timeRuns(nBare, () => spawnAndWait(python, ['-I', '-S', '-c', 'pass'], WORKER_ENV));
  let bareShim: Latency | null = null;
  try {
    bareShim = await timeRuns(Math.ceil(nBare / 5), () => spawnAndWait('python3', ['-I', '-S', '-c', 'pass'], process.env));
  } catch {
    bareShim = null;
  }

  log(`warm pool x${nWarm} per program`);
  const pool = await createPythonPool({ tools, size: 2 });
  let warmTrivial: Latency;
  let warmThree: Latency;
  try {
    for (let i = 0; i < 20; i++) await pool.run(TRIVIAL_PY); // warm-up
    warmTrivial = await timeRuns(nWarm, () => pool.run(TRIVIAL_PY), ok('1\n'));
    warmThree = await timeRuns(nWarm, () => pool.run(THREE_CALLS_PY), ok(expectedLen));
  } finally {
    await pool.close();
  }

  log(`fresh worker per program x${nFresh}`);
  const freshTrivial = await timeRuns(nFresh, () => runPythonOnce(TRIVIAL_PY, { tools }), ok('1\n'));
  const freshThree = await timeRuns(nFresh, () => runPythonOnce(THREE_CALLS_PY, { tools }), ok(expectedLen));

  log(`QuickJS x${nWarm} per program`);
  const qjs = await createQuickJSSandbox({ tools });
  let qjsTrivial: Latency;
  let qjsThree: Latency;
  try {
    for (let i = 0; i < 20; i++) await qjs.run(TRIVIAL_JS);
    qjsTrivial = await timeRuns(nWarm, () => qjs.run(TRIVIAL_JS), ok('1\n'));
    qjsThree = await timeRuns(nWarm, () => qjs.run(THREE_CALLS_JS), ok(expectedLen));
  } finally {
    await qjs.close();
  }

  const results = {
    isolation: {
      level: isolation.level,
      network: isolation.network,
      readonlyFs: isolation.readonlyFs,
      seccomp: isolation.seccomp,
      uidDrop: isolation.uidDrop,
    },
    python,
    // The floor a spawn-per-program design cannot go below, measured in the same run:
    bare_python_start: bare,
    bare_python_start_via_path: bareShim,
    warm_pool_trivial: warmTrivial,
    warm_pool_three_calls: warmThree,
    fresh_worker_trivial: freshTrivial,
    fresh_worker_three_calls: freshThree,
    quickjs_trivial: qjsTrivial,
    quickjs_three_calls: qjsThree,
    warm_vs_bare_start_p50: Math.round((bare.p50_ms / warmTrivial.p50_ms) * 10) / 10,
  };
  const row = (name: string, l: Latency | null) =>
    l ? `| ${name} | ${l.p50_ms.toFixed(2)} | ${l.p99_ms.toFixed(2)} | ${l.n} |` : `| ${name} | n/a | n/a | 0 |`;
  const table = [
    `Sandbox latency per program (isolation: ${isolation.level}${isolation.seccomp ? ' + seccomp' : ''}${isolation.uidDrop ? ' + uid drop' : ''})`,
    '',
    '| case | p50 ms | p99 ms | n |',
    '|---|---:|---:|---:|',
    row('warm Python pool, trivial', warmTrivial),
    row('warm Python pool, 3 search calls', warmThree),
    row('fresh worker per program, trivial', freshTrivial),
    row('fresh worker per program, 3 search calls', freshThree),
    row('bare `python3 -I -S -c pass` (real binary)', bare),
    row('bare `python3 -I -S -c pass` (PATH)', bareShim),
    row('QuickJS, trivial', qjsTrivial),
    row('QuickJS, 3 search calls', qjsThree),
  ].join('\n');
  return { kind: 'sandbox', results, table };
}
