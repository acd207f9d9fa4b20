/** Process-wide native runtime settings: thread count, BLAS core type, the addon itself. */
import { availableParallelism } from 'node:os';
import { readFileSync } from 'node:fs';
import { addon as loadAddon } from '../binding/index.js';
import type { NativeAddon } from '../binding/types.js';
import { SlmError } from '../errors.js';

let configured = false;

/**
 * OpenBLAS 0.3.21 misdetects recent Xeons (e.g. Emerald Rapids) and falls back to slow kernels
 * (~30 vs ~200 GFLOP/s here). On CPUs with AVX-512 we pin SKYLAKEX before the library loads,
 * unless the user chose a core type.
 */
function tuneOpenBlas(): void {
  if (process.env.OPENBLAS_CORETYPE) return;
  try {
    const flags = readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:(.*)$/m)?.[1] ?? '';
    if (/\bavx512f\b/.test(flags) && /\bavx512bw\b/.test(flags) && /\bavx512vl\b/.test(flags)) process.env.OPENBLAS_CORETYPE = 'SKYLAKEX';
  } catch {
    /* not Linux: leave OpenBLAS to its own detection */
  }
}

function defaultThreads(): number {
  const env = Number(process.env.SLM_TRAIN_THREADS);
  return Number.isInteger(env) && env > 0 ? env : availableParallelism();
}

/** The addon, with threads set (libtorch starts with 1 thread here otherwise). */
export function native(): NativeAddon {
  if (!configured) tuneOpenBlas();
  const a = loadAddon();
  if (!configured) {
    a.setThreads(defaultThreads());
    configured = true;
  }
  return a;
}

export function setThreads(n: number): void {
  if (!Number.isInteger(n) || n < 1) throw new SlmError('ARGUMENT_INVALID', `threads must be a positive integer, found ${n}.`);
  native().setThreads(n);
}
