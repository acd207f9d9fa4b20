/**
 * `slm-train doctor`: what this machine gives the engine, measured, with the fix where something is
 * slow or missing.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism, loadavg, totalmem } from 'node:os';
import { loadBinding } from './binding/index.js';
import { native } from './engine/runtime.js';
import { detectIsolation } from './sandbox/isolation.js';
import type { IsolationReport } from './sandbox/types.js';

export interface DoctorReport {
  binding: { path: string; kind: string } | { error: string };
  libtorch?: { version: string; cuda: boolean; parallel: string; cpuCapability?: string; malloc?: string; cpuCache?: string };
  /** The engine's own CPU kernels: the instruction set in force (SLM_TRAIN_CPU_ISA caps it), the CPU's, and what each kernel runs. */
  kernels?: { isa: string; detected: string; linear: string; attention: string };
  blas?: {
    library: string;
    openblasCoretype?: string;
    matmulF32Gflops: number;
    matmulBf16Gflops: number;
    copyGBps: number;
    readGBps: number;
  };
  threads?: { engine: number; cores: number };
  memoryGiB: number;
  python?: { executable: string; version: string } | { error: string };
  sandbox?: IsolationReport | { error: string };
  warnings: string[];
}

/** Which BLAS the process really mapped (libtorch links the system libblas.so.3 alternative). */
function loadedBlas(): string {
  try {
    const maps = readFileSync('/proc/self/maps', 'utf8');
    const libs = [
      ...new Set(
        maps
          .split('\n')
          .map((l) => l.split(/\s+/)[5] ?? '')
          .filter((p) => /lib(open)?blas|libmkl|blis/.test(p)),
      ),
    ];
    if (libs.some((l) => /openblas/.test(l))) return `OpenBLAS (${libs.find((l) => /openblas/.test(l))})`;
    if (libs.some((l) => /mkl/.test(l))) return 'MKL';
    if (libs.some((l) => /blis/.test(l))) return 'BLIS';
    if (libs.length) return `reference BLAS (${libs[0]})`;
    return 'none mapped';
  } catch {
    return 'unknown (no /proc/self/maps)';
  }
}

export function findPython(): { executable: string; version: string } | { error: string } {
  for (const cand of ['python3', '/usr/bin/python3']) {
    try {
      const out = execFileSync(cand, ['-c', 'import sys; print(sys.executable); print(sys.version.split()[0])'], {
        encoding: 'utf8',
        timeout: 10000,
      });
      const [executable, version] = out.trim().split('\n');
      return { executable, version };
    } catch {
      /* try the next */
    }
  }
  return { error: 'python3 not found: install it (apt-get install python3) for the Python sandbox.' };
}

/**
 * bfloat16 on a CPU without a native bf16 matmul path (AVX-512 BF16 / AMX) is emulated and can be an
 * order of magnitude slower than float32; say so, with the setting that avoids it.
 */
export function bf16Advice(opts: { cuda: boolean; f32Gflops: number; bf16Gflops: number }): string | null {
  if (!(opts.bf16Gflops > 0 && opts.f32Gflops > 0) || opts.bf16Gflops >= 0.5 * opts.f32Gflops) return null;
  return (
    `bfloat16 matmul runs at ${opts.bf16Gflops.toFixed(1)} GFLOP/s here, ${(opts.f32Gflops / opts.bf16Gflops).toFixed(0)}x slower than float32 (${opts.f32Gflops.toFixed(1)}): this CPU has no fast bfloat16 path (AVX-512 BF16 or AMX). ` +
    `On the CPU use model.dtype: float32 (or --dtype float32)${opts.cuda ? '; on CUDA devices bfloat16 is unaffected' : ''}.`
  );
}

export async function doctor(opts: { seconds?: number } = {}): Promise<DoctorReport> {
  const warnings: string[] = [];
  const report: DoctorReport = { binding: { error: '' }, memoryGiB: +(totalmem() / 2 ** 30).toFixed(1), warnings };
  try {
    const b = loadBinding();
    report.binding = { path: b.path, kind: b.kind };
  } catch (e) {
    report.binding = { error: (e as Error).message };
    warnings.push('the native engine is not available: see the binding error above.');
  }
  if (!('error' in report.binding)) {
    const a = native();
    const v = a.version();
    const cap = /CPU capability usage: (\S+)/.exec(v.config)?.[1];
    report.libtorch = {
      version: v.torch,
      cuda: v.cuda,
      parallel: /ATen parallel backend: (\S+)/.exec(v.parallel)?.[1] ?? 'unknown',
      cpuCapability: cap,
      malloc: v.malloc,
      cpuCache: v.cpuCache,
    };
    report.kernels = { isa: v.cpuIsa, detected: v.cpuIsaDetected, linear: v.smallLinear, attention: v.attentionKernel };
    const seconds = opts.seconds ?? 0.4;
    const f32 = await a.measure({ kind: 'matmul', n: 1024, dtype: 'float32', seconds });
    const bf16 = await a.measure({ kind: 'matmul', n: 1024, dtype: 'bfloat16', seconds });
    const copy = await a.measure({ kind: 'copy', n: 256 << 20, seconds });
    const read = await a.measure({ kind: 'read', n: 256 << 20, seconds });
    const library = loadedBlas();
    report.blas = {
      library,
      openblasCoretype: process.env.OPENBLAS_CORETYPE,
      matmulF32Gflops: +f32.toFixed(1),
      matmulBf16Gflops: +bf16.toFixed(1),
      copyGBps: +copy.toFixed(1),
      readGBps: +read.toFixed(1),
    };
    report.threads = { engine: v.threads, cores: availableParallelism() };
    const perCore = f32 / v.threads;
    const advice = blasAdvice({ library, perThreadGflops: perCore, loadAverage: loadavg()[0], cores: availableParallelism() });
    if (advice) warnings.push(advice);
    const bfAdvice = bf16Advice({ cuda: v.cuda, f32Gflops: f32, bf16Gflops: bf16 });
    if (bfAdvice) warnings.push(bfAdvice);
    if (v.threads < availableParallelism())
      warnings.push(`the engine uses ${v.threads} of ${availableParallelism()} cores: set SLM_TRAIN_THREADS or --threads.`);
  }
  report.python = findPython();
  if ('error' in report.python) warnings.push(report.python.error);
  try {
    const iso = await detectIsolation();
    report.sandbox = iso;
    if (!iso.network || !iso.readonlyFs || !iso.hostFilesHidden) {
      const gaps = [
        !iso.network && 'programs can reach the network',
        !iso.readonlyFs && 'programs can write outside their folder',
        !iso.hostFilesHidden && `a program can read ${iso.readable}`,
      ].filter(Boolean);
      warnings.push(
        `the Python sandbox runs at isolation level ${iso.level}: ${gaps.join('; ')}. In RL a policy that can read the questions file learns to read its answer key. ` +
          'Install bubblewrap (apt-get install bubblewrap) for full isolation, or use --sandbox quickjs; sandbox.require_isolation: bwrap makes a run refuse to start without it.',
      );
    }
  } catch (e) {
    report.sandbox = { error: (e as Error).message };
    warnings.push(`the Python sandbox cannot start: ${(e as Error).message}`);
  }
  return report;
}

/**
 * What to do about the measured float32 matmul rate: the reference BLAS (or a rate only it would
 * give) needs OpenBLAS; OpenBLAS below its usual rate is misdetecting the CPU — unless other
 * processes are keeping the cores busy, in which case the figure itself is not trustworthy.
 */
export function blasAdvice(opts: { library: string; perThreadGflops: number; loadAverage: number; cores: number }): string | null {
  const rate = `float32 matmul runs at ${opts.perThreadGflops.toFixed(0)} GFLOP/s per thread`;
  const busy = opts.loadAverage > 0.75 * opts.cores;
  const busyNote = `the 1-minute load average is ${opts.loadAverage.toFixed(1)} on ${opts.cores} cores, so other processes share the CPU and this figure is low; run \`slm-train doctor\` again on an idle machine`;
  if (/reference BLAS/.test(opts.library))
    return `${rate} with the reference BLAS (${opts.library}), ~40x slower than OpenBLAS. Install it: apt-get install libopenblas0-openmp.`;
  if (/OpenBLAS/.test(opts.library)) {
    if (opts.perThreadGflops >= 40) return null;
    return busy
      ? `${rate}: ${busyNote}.`
      : `${rate}: OpenBLAS may misdetect this CPU; try OPENBLAS_CORETYPE=SKYLAKEX (AVX-512) or HASWELL (AVX2).`;
  }
  if (opts.perThreadGflops < 15)
    return busy
      ? `${rate}: ${busyNote}.`
      : `${rate} (${opts.library}): that is reference-BLAS speed. Install OpenBLAS: apt-get install libopenblas0-openmp.`;
  return null;
}

export function formatDoctor(report: DoctorReport): string {
  const lines: string[] = [];
  const row = (k: string, v: string) => lines.push(`${k.padEnd(16)} ${v}`);
  row('native addon', 'error' in report.binding ? `MISSING\n${report.binding.error}` : `${report.binding.path} (${report.binding.kind})`);
  if (report.libtorch)
    row(
      'libtorch',
      `${report.libtorch.version}, ${report.libtorch.cuda ? 'CUDA available' : 'CPU only (no CUDA)'}, ${report.libtorch.parallel}, kernels ${report.libtorch.cpuCapability ?? '?'}, malloc ${report.libtorch.malloc ?? '?'}, tensors ${report.libtorch.cpuCache ?? '?'}`,
    );
  if (report.kernels)
    row(
      'CPU kernels',
      `${report.kernels.isa}${report.kernels.isa !== report.kernels.detected ? ` (capped by SLM_TRAIN_CPU_ISA; the CPU has ${report.kernels.detected})` : ''}: linear ${report.kernels.linear}, attention ${report.kernels.attention}`,
    );
  if (report.blas) {
    row('BLAS', `${report.blas.library}${report.blas.openblasCoretype ? `, OPENBLAS_CORETYPE=${report.blas.openblasCoretype}` : ''}`);
    row(
      'matmul',
      `float32 ${report.blas.matmulF32Gflops} GFLOP/s, bfloat16 ${report.blas.matmulBf16Gflops} GFLOP/s (1024x1024, measured now)`,
    );
    row('memory copy', `${report.blas.copyGBps} GB/s (read + write, measured now)`);
    row('memory read', `${report.blas.readGBps} GB/s (what a decode step reads its weights at, measured now)`);
  }
  if (report.threads) row('threads', `${report.threads.engine} engine threads on ${report.threads.cores} cores`);
  row('memory', `${report.memoryGiB} GiB`);
  if (report.python)
    row('python3', 'error' in report.python ? report.python.error : `${report.python.executable} (${report.python.version})`);
  if (report.sandbox)
    row(
      'sandbox',
      'error' in report.sandbox
        ? `UNAVAILABLE: ${report.sandbox.error}`
        : `isolation ${report.sandbox.level}: network ${report.sandbox.network ? 'blocked' : 'OPEN'}, filesystem ${report.sandbox.readonlyFs ? 'read-only' : 'WRITABLE'}, host files ${report.sandbox.hostFilesHidden ? 'hidden' : 'READABLE'}, seccomp ${report.sandbox.seccomp ? 'on' : 'off'}, uid drop ${report.sandbox.uidDrop ? 'yes' : 'no'}`,
    );
  if (report.sandbox && !('error' in report.sandbox)) row('sandbox files', `a program can read ${report.sandbox.readable}`);
  if (report.warnings.length) {
    lines.push('', 'warnings:');
    for (const w of report.warnings) lines.push(`  - ${w}`);
  } else lines.push('', 'no problems found.');
  return lines.join('\n');
}
