// `bench engine`'s llama.cpp built from source (bench/llama-cpp-source.ts): the parsers of llama-bench's
// JSON and llama-batched-bench's jsonl against real outputs, the folder's checks, the command lines, a
// tool past its time limit, the rows, and the plumbing `slm-train bench engine --llama-cpp-bin DIR` ->
// llamaCppBin -> runBench -> the tools (fake tools that print the recorded outputs and log their argv).
// With SLM_TRAIN_LLAMA_CPP_BIN set, a real run on a tiny model; skipped otherwise (CI builds no llama.cpp).
//
// The fixtures, test/fixtures/llama-cpp/, are real outputs of llama.cpp commit 0c1e570 (the source
// in the llama-cpp-python 0.3.36 sdist, vendor/llama.cpp; cmake -G Ninja -DCMAKE_BUILD_TYPE=Release
// -DGGML_NATIVE=ON -DLLAMA_CURL=OFF), 2026-11-26 on a 2-core AMD EPYC (AVX2), on the tiny preset
// (`slm-train init-model --preset tiny`, seed 0) written by `scripts/hf-to-gguf.py --dtype f32|bf16`:
//   llama-bench -m tiny.D.gguf -t 2 -p 32 -n 4 -r 2 -ctk K -ctv K -o json > llama-bench.D.json
//   llama-batched-bench -m tiny.D.gguf -t 2 -tb 2 -c 576 -npp 32,32 -ntg 4 -npl 16 -ctk K -ctv K \
//     --output-format jsonl > llama-batched-bench.D.jsonl
// (D f32 with K f16, D bf16 with K bf16; stdout only, the logs go to stderr).
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import {
  LLAMA_CPP_BIN_ENV,
  llamaCppBin,
  llamaCppSourceRows,
  parseBatchedBench,
  parseLlamaBench,
  mergeSourcePasses,
  runLlamaCppSource,
  runSourceBuild,
  llamaBenchDecodeMs,
  summarizeRounds,
  batch1RoundsRows,
  steadyRound,
  type Batch1Round,
} from '../bench/llama-cpp-source.js';
import { combinePasses } from '../bench/engine.js';
import { median } from '../bench/stats.js';
import { ggufPython, NO_GGUF_PYTHON } from '../bench/llama-cpp.js';
import { initModel } from '../lib/model/init.js';
import { runCliAsync } from './helpers/cli.js';
import { needs, repoRoot } from './helpers/shared.js';

const FIX = join(repoRoot, 'test', 'fixtures', 'llama-cpp');
const fixture = (f: string) => readFileSync(join(FIX, f), 'utf8');
const TINY = { prefill: 32, steps: 4 };

t.test("llama-bench's JSON: the prefill and the decode test, their avg_ts and the build", async (t) => {
  const f32 = parseLlamaBench(fixture('llama-bench.f32.json'), TINY);
  t.match(f32.prefill, { build_commit: '0c1e570', build_number: 1, n_threads: 2, type_k: 'f16', type_v: 'f16', n_prompt: 32, n_gen: 0 });
  t.equal(f32.prefill.avg_ts, 12808.275331, 'prefill: the pp32 test');
  t.equal(f32.decode.avg_ts, 530.476899, 'decode: the tg4 test');
  const bf16 = parseLlamaBench(fixture('llama-bench.bf16.json'), TINY);
  t.match(bf16.prefill, { type_k: 'bf16', model_type: /BF16/ });
  t.equal(bf16.decode.avg_ts, 840.181378);
  t.throws(
    () => parseLlamaBench(fixture('llama-bench.f32.json'), { prefill: 512, steps: 4 }),
    /expected a test with n_prompt 512, n_gen 0.*found tests \[\[32,0,/,
  );
  t.throws(() => parseLlamaBench('error: failed to load model', TINY), /llama-bench -o json: expected a JSON array of tests/);
});

t.test("llama-batched-bench's jsonl: S_TG (speed_tg), the median of the runs", async (t) => {
  const r = parseBatchedBench(fixture('llama-batched-bench.f32.jsonl'), { pp: 32, tg: 4, pl: 16 });
  t.equal(r.runs.length, 2, 'one line per -npp value');
  t.equal(r.tokens_per_s, 2031.939453, 'the median (upper of two) of speed_tg');
  t.equal(r.step_ms, (16 / 2031.939453) * 1e3, 'a step decodes 16 tokens');
  t.equal(parseBatchedBench(fixture('llama-batched-bench.bf16.jsonl'), { pp: 32, tg: 4, pl: 16 }).tokens_per_s, 2023.2677);
  t.throws(
    () => parseBatchedBench(fixture('llama-batched-bench.f32.jsonl'), { pp: 32, tg: 4, pl: 8 }),
    /expected lines with pp 32, tg 4, pl 8/,
  );
});

t.test('the folder: none named is no folder; a named one without the tools is a coded error saying what to do', async (t) => {
  t.equal(llamaCppBin(undefined, {}), undefined);
  const dir = t.testdir({ 'llama-bench': '#!/bin/sh\n', 'llama-batched-bench': '#!/bin/sh\n' });
  t.throws(() => llamaCppBin(dir, {}), { code: 'FILE_NOT_FOUND', message: /no executable llama-bench or llama-batched-bench in/ });
  chmodSync(join(dir, 'llama-bench'), 0o755);
  chmodSync(join(dir, 'llama-batched-bench'), 0o755);
  t.equal(llamaCppBin(dir, {}), dir, 'the flag');
  t.equal(llamaCppBin(undefined, { [LLAMA_CPP_BIN_ENV]: dir }), dir, 'the environment variable');
  t.throws(() => llamaCppBin('/nonexistent-llama', { [LLAMA_CPP_BIN_ENV]: dir }), {
    code: 'FILE_NOT_FOUND',
    message:
      /^--llama-cpp-bin \/nonexistent-llama: expected a folder holding llama\.cpp's executables llama-bench and llama-batched-bench.*found no folder \/nonexistent-llama\. Name the build's bin folder/,
  });
  t.throws(() => llamaCppBin(undefined, { [LLAMA_CPP_BIN_ENV]: join(dir, 'build') }), {
    code: 'FILE_NOT_FOUND',
    message: new RegExp(`^${LLAMA_CPP_BIN_ENV}=.*/build: expected a folder .*found no folder`),
  });
});

/**
 * Fake llama-bench and llama-batched-bench: each appends its argv (JSON) to `log` and prints the
 * recorded output with the test's sizes put in (llama-bench: n_prompt / n_gen from -p / -n;
 * batched-bench: one line per -npp value, with -ntg and -npl).
 */
function fakeTools(dir: string, log: string): void {
  const head = `#!${process.execPath}\nconst fs = require('fs');\nconst a = process.argv.slice(2);\nconst v = (f) => a[a.indexOf(f) + 1];\nfs.appendFileSync(${JSON.stringify(log)}, JSON.stringify([require('path').basename(process.argv[1]), ...a]) + '\\n');\n`;
  const bench = `${head}const t = JSON.parse(fs.readFileSync(${JSON.stringify(join(FIX, 'llama-bench.f32.json'))}, 'utf8'));
t[0].n_prompt = +v('-p'); t[1].n_gen = +v('-n'); t[0].n_threads = t[1].n_threads = +v('-t'); t[0].type_k = t[1].type_k = v('-ctk');
console.log(JSON.stringify(t));\n`;
  const batched = `${head}const l = JSON.parse(fs.readFileSync(${JSON.stringify(join(FIX, 'llama-batched-bench.f32.jsonl'))}, 'utf8').split('\\n')[0]);
for (const pp of v('-npp').split(',')) console.log(JSON.stringify({ ...l, pp: +pp, tg: +v('-ntg'), pl: +v('-npl') }));\n`;
  writeFileSync(join(dir, 'llama-bench'), bench, { mode: 0o755 });
  writeFileSync(join(dir, 'llama-batched-bench'), batched, { mode: 0o755 });
}

const argvLog = (log: string) =>
  readFileSync(log, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as string[]);

t.test("runSourceBuild: the tools' command lines, their figures, and a tool past its time limit", async (t) => {
  const dir = t.testdir();
  const log = join(dir, 'argv.jsonl');
  fakeTools(dir, log);
  const r = runSourceBuild(dir, '/m/x.bf16.gguf', 'BF16', { threads: 3, prefill: 64, steps: 6, reps: 3, timeoutS: 60 });
  t.same(argvLog(log), [
    ['llama-bench', '-m', '/m/x.bf16.gguf', '-t', '3', '-p', '64', '-n', '6', '-r', '3', '-ctk', 'bf16', '-ctv', 'bf16', '-o', 'json'],
    [
      'llama-batched-bench',
      ...['-m', '/m/x.bf16.gguf', '-t', '3', '-tb', '3', '-c', String(16 * (32 + 6))],
      ...['-npp', '32,32,32', '-ntg', '6', '-npl', '16', '-ctk', 'bf16', '-ctv', 'bf16', '--output-format', 'jsonl'],
    ],
  ]);
  t.match(r, {
    dtype: 'BF16',
    build_commit: '0c1e570',
    threads: 3,
    kv_cache: 'bf16/f16',
    prefill: { tokens: 64, tokens_per_s: 12808.275331 },
  });
  t.match(r.decode, [
    { batch: 1, steps: 6, tokens_per_s: 530.476899, how: 'llama-bench tg6, avg_ts' },
    { batch: 16, steps: 6, tokens_per_s: 2031.939453, how: /S_TG, 32-token prompts, median of 3/ },
  ]);
  writeFileSync(join(dir, 'llama-bench'), '#!/bin/sh\nexec sleep 30\n', { mode: 0o755 });
  const t0 = Date.now();
  t.throws(
    () => runSourceBuild(dir, '/m/x.gguf', 'F32', { threads: 1, prefill: 8, steps: 2, reps: 1, timeoutS: 1 }),
    /llama-bench did not finish \(killed by SIGKILL after the 1 s limit\)/,
  );
  t.ok(Date.now() - t0 < 20_000, 'the timeout ended it');
  writeFileSync(join(dir, 'llama-bench'), '#!/bin/sh\necho "error: unknown model architecture" >&2\nexit 1\n', { mode: 0o755 });
  t.throws(
    () => runSourceBuild(dir, '/m/x.gguf', 'F32', { threads: 1, prefill: 8, steps: 2, reps: 1, timeoutS: 60 }),
    /llama-bench failed \(exit 1\): error: unknown model architecture/,
  );
});

t.test("batch 1 in alternated rounds: llama-bench's decode alone, the median of the rounds' ratios, the rows", async (t) => {
  const dir = t.testdir();
  const log = join(dir, 'argv.jsonl');
  fakeTools(dir, log);
  const ms = llamaBenchDecodeMs(dir, '/m/x.f32.gguf', 'F32', { threads: 3, steps: 48, reps: 2, timeoutS: 60 });
  t.same(argvLog(log), [
    ['llama-bench', '-m', '/m/x.f32.gguf', '-t', '3', '-p', '0', '-n', '48', '-r', '2', '-ctk', 'f16', '-ctv', 'f16', '-o', 'json'],
  ]);
  t.equal(ms, 1e3 / 530.476899, 'ms per step from the tg test');
  // Four rounds, three at one memory speed (their three reads within 15 %); the second straddles a switch (30 -> 60 GB/s).
  const round = (first: 'slm-train' | 'llama.cpp', ours: number, llama: number, reads: [number, number, number]) => ({
    first,
    ours_ms: ours,
    llama_ms: llama,
    ratio: llama / ours,
    read_GBps: reads,
  });
  const rounds = [
    round('slm-train', 10, 11, [40, 40, 40]),
    round('llama.cpp', 12, 11, [30, 60, 60]),
    round('slm-train', 8, 10, [50, 50, 45]),
    round('llama.cpp', 9, 8.5, [36, 34, 35]),
  ];
  t.same(rounds.map(steadyRound), [true, false, true, true]);
  const bytes = 400e6; // 10 ms at 40 GB/s
  const s = summarizeRounds('F32', 48, rounds, bytes);
  t.equal(s.steady, 3);
  t.equal(s.median_ratio, 1.1, "the median of the steady rounds' ratios (1.1, 1.25, 8.5 / 9)");
  t.same([s.min_ratio, s.max_ratio, s.ahead], [8.5 / 9, 1.25, 2]);
  // Each side's bound at the harmonic mean of the reads around it (the first side: reads 0 and 1; the second: 1 and 2).
  const hm = (x: number, y: number) => 2 / (1 / x + 1 / y);
  const frac = (g: number, ms: number) => bytes / (g * 1e9) / 1e-3 / ms;
  const ours = [frac(40, 10), frac(50, 8), frac(hm(34, 35), 9)].sort((x, y) => x - y);
  const theirs = [frac(40, 11), frac(hm(50, 45), 10), frac(hm(36, 34), 8.5)].sort((x, y) => x - y);
  t.ok(Math.abs(s.fraction_of_memory_bound.slm_train - ours[1]) < 1e-12, `slm-train ${s.fraction_of_memory_bound.slm_train}`);
  t.ok(Math.abs(s.fraction_of_memory_bound.llama_cpp - theirs[1]) < 1e-12, `llama.cpp ${s.fraction_of_memory_bound.llama_cpp}`);
  t.throws(() => summarizeRounds('F32', 48, [], bytes), /no rounds/);
  const [row] = batch1RoundsRows([s]);
  t.match(
    row,
    '| slm-train float32 / llama.cpp F32, decode batch 1, 4 alternated rounds (tg48 each side; per round: 1.10, 0.92*, 1.25, 0.94; * the memory speed moved within the round) ',
  );
  t.match(row, '| median 1.10x (0.94-1.25; slm-train ahead in 2) over the 3 of 4 rounds at one memory speed ');
  t.match(row, 'memory bound at the reads around each side (34.0-50.0 GB/s): slm-train 1.000, ');
  // No round at one speed: all of them, and the row says so.
  const none = summarizeRounds('BF16', 48, [rounds[1]], bytes);
  t.same([none.steady, none.median_ratio], [0, 11 / 12]);
  t.match(batch1RoundsRows([none])[0], 'over all 1 rounds (none at one memory speed)');
  t.same(batch1RoundsRows([{ dtype: 'BF16', skipped: 'llama-bench failed (exit 1): boom' }]), [
    '| slm-train / llama.cpp BF16, decode batch 1, alternated rounds | skipped: llama-bench failed (exit 1): boom | | |',
  ]);
});

t.test('the rows: each dtype beside slm-train in the same dtype, with the ratio; skipped ones say why', async (t) => {
  const dir = t.testdir();
  fakeTools(dir, join(dir, 'argv.jsonl'));
  const run = runSourceBuild(dir, '/m/x.gguf', 'F32', { threads: 2, prefill: 32, steps: 4, reps: 2, timeoutS: 60 });
  const rows = llamaCppSourceRows(
    { bin: dir, runs: [run, { dtype: 'BF16', skipped: 'because' }] },
    {
      prefill: (d) => (d === 'float32' ? 2 * 12808.275331 : undefined),
      decode: (d, B) => (d === 'float32' && B === 1 ? 530.476899 / 2 : undefined),
    },
  ).join('\n');
  t.match(
    rows,
    /\| llama\.cpp source build 0c1e570 \(build 1\), F32 GGUF, KV f16\/f16, flash attention auto, 2 threads: prefill 32 tokens, batch 1 \(llama-bench pp32\) \| 12808\.3 tok\/s/,
  );
  t.match(rows, /\| slm-train float32 \/ llama\.cpp F32, prefill 32 tokens \| 2\.00x \|/);
  t.match(rows, /\| slm-train float32 \/ llama\.cpp F32, decode batch 1 \| 0\.50x \|/);
  t.match(rows, /decode batch 16 \(llama-batched-bench S_TG, 32-token prompts, median of 2\) \| 2031\.9 tok\/s \(7\.87 ms\/step\)/);
  t.match(rows, /\| slm-train float32 \/ llama\.cpp F32, decode batch 16 \| not measured \|/);
  t.match(rows, /\| llama\.cpp \(source build\), BF16 GGUF \| skipped: because \|/);
  t.same(llamaCppSourceRows({ skipped: 'no folder' }, { prefill: () => 1, decode: () => 1 }), [
    '| llama.cpp (source build) | skipped: no folder | | |',
  ]);
  t.match(runLlamaCppSource('/x', { bin: undefined, threads: 1, prefill: 8, steps: 2, reps: 1, timeoutS: 1 }), {
    skipped: /no llama\.cpp build from source named \(--llama-cpp-bin DIR or SLM_TRAIN_LLAMA_CPP_BIN=DIR/,
  });
});

t.test(
  'slm-train bench engine --llama-cpp-bin DIR (or SLM_TRAIN_LLAMA_CPP_BIN) lacking the tools: a coded error before any benchmark',
  async (t) => {
    const empty = t.testdir();
    for (const [args, env, named] of [
      [['--llama-cpp-bin', empty], {}, `--llama-cpp-bin ${empty}`],
      [[], { [LLAMA_CPP_BIN_ENV]: empty }, `${LLAMA_CPP_BIN_ENV}=${empty}`],
    ] as const) {
      const r = await runCliAsync(['bench', 'engine', '--quick', ...args], { env, timeout: 60_000 });
      t.equal(r.code, 2, named);
      t.match(r.stderr, `FILE_NOT_FOUND: ${named}: expected a folder holding llama.cpp's executables llama-bench and llama-batched-bench`);
      t.notMatch(r.stderr, /\[bench\]/, 'no benchmark ran');
    }
  },
);

/** `slm-train bench engine --quick --llama-cpp-bin BIN` on the tiny preset in `tmp`, 2 threads; asserts it exits 0. */
async function quickEngine(
  t: Test,
  tmp: string,
  bin: string,
  extra: string[] = [],
): Promise<{ r: Awaited<ReturnType<typeof runCliAsync>>; out: string }> {
  const model = join(tmp, 'tiny');
  initModel({ preset: 'tiny', out: model, seed: 0 });
  const out = join(tmp, 'bench.json');
  const r = await runCliAsync(['bench', 'engine', '--quick', '--out', out, '--model', model, '--llama-cpp-bin', bin, ...extra], {
    env: { SLM_TRAIN_CACHE: join(tmp, 'cache'), SLM_TRAIN_THREADS: '2', [LLAMA_CPP_BIN_ENV]: '' },
    timeout: 840_000,
  });
  t.equal(r.code, 0, r.stderr.slice(-3000));
  return { r, out };
}

const python = ggufPython();
const noGguf = needs(python ? false : NO_GGUF_PYTHON, t);

t.test(
  'slm-train bench engine --llama-cpp-bin DIR: the flag reaches the tools, run on F32 and BF16 GGUFs with the thread count, into the JSON and the table',
  { skip: noGguf, timeout: 900_000 },
  async (t) => {
    const tmp = t.testdir();
    const bin = join(tmp, 'bin');
    mkdirSync(bin);
    const log = join(tmp, 'argv.jsonl');
    fakeTools(bin, log);
    const { r, out } = await quickEngine(t, tmp, bin, ['--rounds', '2']);
    const calls = argvLog(log);
    t.same(
      calls.map((c) => [c[0], c[c.indexOf('-m') + 1].replace(/.*\./, ''), c[c.indexOf('-t') + 1]]),
      [
        ['llama-bench', 'gguf', '2'],
        ['llama-batched-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
        ['llama-batched-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
        ['llama-batched-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
        ['llama-batched-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
        ['llama-bench', 'gguf', '2'],
      ],
      'both tools for each dtype, in two passes, with slm-train thread count; then llama-bench alone in the batch-1 rounds',
    );
    t.same(
      calls.slice(8).map((c) => [c[c.indexOf('-m') + 1].replace(/.*\.(\w+)\.gguf$/, '$1'), c[c.indexOf('-p') + 1], c[c.indexOf('-n') + 1]]),
      [
        ['f32', '0', '16'],
        ['f32', '0', '16'],
        ['bf16', '0', '16'],
        ['bf16', '0', '16'],
      ],
      '--quick: two rounds per dtype, decode alone (-p 0), the steps of the other rows',
    );
    t.match(calls[4][2], /\.f32\.gguf$/, 'the second pass: F32 again');
    t.match(calls[0][2], /\.f32\.gguf$/);
    t.match(calls[2][2], /\.bf16\.gguf$/);
    t.same([calls[0][calls[0].indexOf('-p') + 1], calls[0][calls[0].indexOf('-n') + 1]], ['128', '16'], '--quick: prefill 128, 16 steps');
    const doc = JSON.parse(readFileSync(out, 'utf8'));
    const src = doc.reports.engine.llama_cpp_source;
    t.equal(src.bin, bin);
    // The fake tools print the same figures in both passes: their mean is that figure.
    t.match(src.runs, [
      { dtype: 'F32', build_commit: '0c1e570', prefill: { tokens: 128, tokens_per_s: 12808.275331, passes: [12808.275331, 12808.275331] } },
      { dtype: 'BF16', kv_cache: 'bf16/f16' },
    ]);
    const passes = doc.reports.engine.passes;
    t.equal(passes.length, 2, "slm-train's two passes in the JSON");
    t.ok(
      passes.every((p: { prefill_s: number; decode_step_ms: unknown[] }) => p.prefill_s > 0 && p.decode_step_ms.length === 4),
      'each with its prefill and its four decodes',
    );
    const meanS = (passes[0].prefill_bfloat16_s + passes[1].prefill_bfloat16_s) / 2;
    t.ok(
      Math.abs(doc.reports.engine.prefill_bfloat16.tokens_per_s - 128 / meanS) <= 0.1 + 1e-3 * (128 / meanS),
      "slm-train's figure is that of its passes' mean time",
    );
    t.ok(doc.reports.engine.prefill_bfloat16.tokens_per_s > 0, 'the bfloat16 prefill beside the BF16 rows');
    const ratio = doc.reports.engine.prefill_bfloat16.tokens_per_s / 12808.275331;
    t.match(
      r.stdout,
      /\| llama\.cpp source build 0c1e570 \(build 1\), F32 GGUF, KV f16\/f16, flash attention auto, 2 threads: prefill 128 tokens/,
    );
    t.match(
      r.stdout,
      `| slm-train bfloat16 / llama.cpp BF16, prefill 128 tokens | ${ratio.toFixed(2)}x (passes: `,
      'the table, with the ratio',
    );
    t.match(
      r.stdout,
      /\| slm-train float32 \/ llama\.cpp F32, decode batch 1 \| [\d.]+x \(passes: [\d.]+x \/ [\d.]+x\) \|/,
      "and each pass's own",
    );
    t.match(r.stdout, /\| slm-train bfloat16 \/ llama\.cpp BF16, decode batch 16 \| [\d.]+x \(passes: [\d.]+x \/ [\d.]+x\) \|/);
    // Each decode row's memory bound is its weights' bytes at the read bandwidth measured around that
    // decode, its compute bound its FLOPs at the matmul rate (of its dtype) measured around it
    // (aroundRead; the passes' harmonic means), which the row and its table line carry; the fraction
    // at the run's best rate beside it.
    const eng = doc.reports.engine;
    t.equal(eng.decode.length, 4);
    for (const d of eng.decode) {
      const bytes = d.dtype === 'bfloat16' ? eng.decode_bytes_per_step / 2 : eng.decode_bytes_per_step;
      const want = bytes / (d.read_GBps * 1e9) / 1e-3; // ms
      t.ok(d.read_GBps > 0, `${d.dtype} batch ${d.batch}: read ${d.read_GBps} GB/s around it`);
      // The JSON rounds the rates to 0.1 (and the bounds to 0.01 ms), the bounds come from the rates
      // unrounded: the rounding's relative share (0.05 / the rate) is part of the tolerance, which
      // matters where a loaded machine reads a few GB/s (the CI run of 2026-11-29: 4.35 ms against
      // 4.3284 from a rounded rate).
      const relR = 0.05 / d.read_GBps,
        relM = 0.05 / d.matmul_GFLOPs;
      t.ok(
        Math.abs(d.memory_bound_step_ms - want) <= 0.006 + (0.001 + 1.01 * relR) * want,
        `${d.dtype} batch ${d.batch}: memory bound ${d.memory_bound_step_ms} ms = bytes / its read bandwidth (${want.toFixed(4)})`,
      );
      const flops = (2 * eng.decode_bytes_per_step * d.batch) / (eng.model.parameter_bytes / eng.model.parameters);
      const wantC = flops / (d.matmul_GFLOPs * 1e9) / 1e-3; // ms
      t.ok(
        Math.abs(d.compute_bound_step_ms - wantC) <= 0.006 + (0.001 + 1.01 * relM) * wantC,
        `${d.dtype} batch ${d.batch}: compute bound ${d.compute_bound_step_ms} ms = FLOPs / the matmul rate around it, ${d.matmul_GFLOPs} GFLOP/s (${wantC.toFixed(4)})`,
      );
      const best = d.dtype === 'bfloat16' ? eng.machine.matmul_bf16_GFLOPs : eng.machine.matmul_f32_GFLOPs;
      // The two fractions of one step time: in the ratio of the two bounds (both from the JSON's rates).
      const boundAround = Math.max(want, wantC),
        boundBest = Math.max(want, flops / (best * 1e9) / 1e-3);
      const atBest = (d.fraction_of_roofline * boundBest) / boundAround;
      t.ok(
        Math.abs(d.fraction_at_best_rate - atBest) <= 0.0015 + (0.002 + 2.02 * (relR + relM)) * atBest,
        `${d.dtype} batch ${d.batch}: ${d.fraction_at_best_rate} at the best rate, ${best} GFLOP/s (${atBest.toFixed(4)})`,
      );
      t.match(r.stdout, `| decode ${d.dtype} batch ${d.batch} | `);
      t.match(
        r.stdout,
        `ms/step; read ${d.read_GBps} GB/s, matmul ${d.matmul_GFLOPs} GFLOP/s around it) | ${d.fraction_of_roofline}${d.fraction_at_best_rate === d.fraction_of_roofline ? '' : ` (at the run's best matmul rate: ${d.fraction_at_best_rate})`} |`,
      );
    }
    t.ok(eng.machine.read_GBps > 0, "the run's best read bandwidth in the machine row");
    // The alternated batch-1 rounds: the order flips each round, each ratio is llama.cpp's ms over slm-train's.
    const rounds = eng.llama_cpp_source_batch1_rounds;
    t.same(
      rounds.map((x: { dtype: string }) => x.dtype),
      ['F32', 'BF16'],
    );
    for (const x of rounds) {
      t.same(
        x.rounds.map((r: { first: string }) => r.first),
        ['slm-train', 'llama.cpp'],
        `${x.dtype}: the order alternates`,
      );
      for (const r of x.rounds) {
        t.ok(Math.abs(r.llama_ms - 1e3 / 530.476899) < 1e-9, "llama.cpp's turn: the fake tool's tg rate");
        t.ok(r.ours_ms > 0 && Math.abs(r.ratio - r.llama_ms / r.ours_ms) < 1e-12, `${x.dtype}: ratio ${r.ratio}`);
        t.ok(r.read_GBps.length === 3 && r.read_GBps.every((g: number) => g > 0), 'the reads before, between and after');
      }
      // The median over the rounds at one memory speed (a shared machine's reads can move within a round), all when none is.
      const steady = x.rounds.filter(steadyRound);
      t.equal(x.steady, steady.length);
      t.equal(x.median_ratio, median((steady.length ? steady : x.rounds).map((r: Batch1Round) => r.ratio)));
      t.match(r.stdout, `decode batch 1, 2 alternated rounds (tg16 each side; per round: `);
      t.match(r.stdout, `| median ${x.median_ratio.toFixed(2)}x (`);
    }
    // --rounds 2 reached the batch-16 decode rounds: the order flips, each decode at the rates around it.
    const dr = eng.decode_batch16_rounds;
    t.equal(dr.rounds.length, 2, '--rounds 2: two rounds');
    t.same(
      dr.rounds.map((r: Array<{ dtype: string }>) => r.map((x) => x.dtype)),
      [
        ['float32', 'bfloat16'],
        ['bfloat16', 'float32'],
      ],
    );
    for (const r of dr.rounds)
      for (const x of r) t.ok(x.step_ms > 0 && x.fraction_of_roofline > 0 && x.read_GBps > 0 && x.matmul_GFLOPs > 0, JSON.stringify(x));
    t.match(
      r.stdout,
      `| decode batch 16, 2 alternated rounds (fraction of the roofline at the read and matmul rate around each decode) | float32 `,
    );
  },
);

t.test(
  'slm-train bench engine --llama-cpp-bin DIR: a llama-bench failing in the batch-1 rounds skips them, saying why; the run goes on',
  { skip: noGguf, timeout: 900_000 },
  async (t) => {
    const tmp = t.testdir();
    const bin = join(tmp, 'bin');
    mkdirSync(bin);
    fakeTools(bin, join(tmp, 'argv.jsonl'));
    // The real fake for every call but the rounds' decode-only one (-p 0), which fails.
    // (extensionless, as node runs it: under this package's "type": "module" an unknown extension is refused)
    mkdirSync(join(tmp, 'real'));
    const real = join(tmp, 'real', 'llama-bench');
    writeFileSync(real, readFileSync(join(bin, 'llama-bench')), { mode: 0o755 });
    writeFileSync(
      join(bin, 'llama-bench'),
      `#!/bin/sh\ncase " $* " in *" -p 0 "*) echo "error: out of memory" >&2; exit 3;; esac\nexec ${JSON.stringify(real)} "$@"\n`,
      { mode: 0o755 },
    );
    const { r, out } = await quickEngine(t, tmp, bin);
    const eng = JSON.parse(readFileSync(out, 'utf8')).reports.engine;
    t.match(eng.llama_cpp_source_batch1_rounds, [
      { dtype: 'F32', skipped: /llama-bench failed \(exit 3\): error: out of memory/ },
      { dtype: 'BF16', skipped: /exit 3/ },
    ]);
    t.match(
      r.stdout,
      '| slm-train / llama.cpp F32, decode batch 1, alternated rounds | skipped: llama-bench failed (exit 3): error: out of memory |',
    );
    t.match(r.stdout, /\| slm-train float32 \/ llama\.cpp F32, decode batch 1 \| [\d.]+x \(passes: /, 'the passes are there');
  },
);

const realBin = process.env[LLAMA_CPP_BIN_ENV];
t.test(
  `a real llama.cpp build (${LLAMA_CPP_BIN_ENV}) on a tiny model: F32 and BF16 figures`,
  {
    skip: realBin ? noGguf : `${LLAMA_CPP_BIN_ENV} is not set (the folder of a llama.cpp build from source; CI builds none)`,
    timeout: 600_000,
  },
  async (t) => {
    const tmp = t.testdir();
    process.env.SLM_TRAIN_CACHE = tmp;
    const dir = join(tmp, 'tiny');
    initModel({ preset: 'tiny', out: dir, seed: 0 });
    const r = runLlamaCppSource(dir, { bin: llamaCppBin(undefined), threads: 2, prefill: 32, steps: 4, reps: 2, timeoutS: 300 });
    if ('skipped' in r) return t.fail(r.skipped);
    t.same(
      r.runs.map((x) => x.dtype),
      ['F32', 'BF16'],
    );
    for (const x of r.runs) {
      if ('skipped' in x) {
        t.fail(`${x.dtype}: ${x.skipped}`);
        continue;
      }
      t.match(x, { threads: 2, build_commit: /^[0-9a-f]{7,}|unknown/, kv_cache: x.dtype === 'F32' ? 'f16/f16' : 'bf16/bf16' });
      t.ok(x.prefill.tokens_per_s > 0, `${x.dtype}: prefill ${x.prefill.tokens_per_s.toFixed(0)} tok/s`);
      for (const d of x.decode)
        t.ok(d.tokens_per_s > 0, `${x.dtype}: decode batch ${d.batch} ${d.tokens_per_s.toFixed(0)} tok/s (${d.how})`);
    }
  },
);

t.test('two passes as one: the rate of the mean time on both sides, each pass kept', async (t) => {
  const dir = t.testdir();
  fakeTools(dir, join(dir, 'argv.jsonl'));
  const run = runSourceBuild(dir, '/m/x.gguf', 'F32', { threads: 2, prefill: 32, steps: 4, reps: 2, timeoutS: 60 });
  const slower = {
    ...run,
    prefill: { ...run.prefill, tokens_per_s: run.prefill.tokens_per_s / 3 },
    decode: run.decode.map((d) => ({ ...d, tokens_per_s: d.tokens_per_s / 3 })),
  };
  const merged = mergeSourcePasses(
    { bin: dir, runs: [run, { dtype: 'BF16', skipped: 'x' }] },
    { bin: dir, runs: [slower, { dtype: 'BF16', skipped: 'x' }] },
  );
  if ('skipped' in merged) throw new Error('merged skipped');
  const m = merged.runs[0];
  if ('skipped' in m) throw new Error('F32 skipped');
  // Times 1 and 3 (in units of the first): mean 2, so the rate is half the first pass's.
  t.ok(Math.abs(m.prefill.tokens_per_s - run.prefill.tokens_per_s / 2) < 1e-6, 'prefill: the rate of the mean time');
  t.same(m.prefill.passes, [run.prefill.tokens_per_s, run.prefill.tokens_per_s / 3]);
  for (const [i, d] of m.decode.entries()) {
    t.ok(Math.abs(d.tokens_per_s - run.decode[i].tokens_per_s / 2) < 1e-6, `decode batch ${d.batch}: the rate of the mean time`);
    t.ok(Math.abs(d.step_ms - (1e3 * d.batch) / d.tokens_per_s) < 1e-9, `decode batch ${d.batch}: its step time from that rate`);
  }
  t.match(merged.runs[1], { dtype: 'BF16', skipped: 'x' }, 'a skipped dtype stays skipped');
  t.same(mergeSourcePasses({ skipped: 'no' }, merged), { skipped: 'no' }, 'a skipped first pass stays as it was');
  const c = combinePasses(
    { prefillS: 1, prefillBf16S: 2, decode: [{ dtype: 'float32', batch: 1, stepS: 0.01, readGBps: 20, rateGFLOPs: 100 }] },
    { prefillS: 3, prefillBf16S: 4, decode: [{ dtype: 'float32', batch: 1, stepS: 0.03, readGBps: 60, rateGFLOPs: 300 }] },
  );
  // Read bandwidths 20 and 60 GB/s: memory bounds 1/20 and 1/60 per GB, mean 1/30 -> 30 GB/s; the
  // matmul rates likewise (100 and 300 GFLOP/s -> 150).
  t.same(
    c,
    { prefillS: 2, prefillBf16S: 3, decode: [{ dtype: 'float32', batch: 1, stepS: 0.02, readGBps: 30, rateGFLOPs: 150 }] },
    "slm-train's passes: mean times",
  );
  const rows = llamaCppSourceRows(merged, {
    prefill: () => run.prefill.tokens_per_s,
    decode: () => undefined,
    passes: { prefill: () => [run.prefill.tokens_per_s, run.prefill.tokens_per_s], decode: () => undefined },
  }).join('\n');
  t.match(rows, '| slm-train float32 / llama.cpp F32, prefill 32 tokens | 2.00x (passes: 1.00x / 3.00x) |');
});
