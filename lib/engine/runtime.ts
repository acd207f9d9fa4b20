/** Process-wide native runtime settings: thread count, BLAS core type, the addon itself. */
import { availableParallelism } from 'node:os';
import { readFileSync } from 'node:fs';
import { addon as loadAddon } from '../binding/index.js';
import { CPU_ISA_LEVELS, type NativeAddon } from '../binding/types.js';
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

/** The wait settings we give libgomp unless the user set their own; see tuneOpenMP. */
const OPENMP_WAIT = { OMP_WAIT_POLICY: 'active', GOMP_SPINCOUNT: '1000' } as const;

/**
 * How long libgomp's idle threads spin before they sleep. Its default is ~300,000 pauses (7.5 ms on
 * a Zen 4), cut to 100 (2.5 µs) whenever the process holds more OpenMP threads than cores — which an
 * addon called from libuv's pool always does, since every pool thread that opens a parallel region
 * gets its own team. At 2.5 µs nearly every region of a decode step wakes a sleeping thread through
 * the kernel (~150 context switches per bfloat16 batch-16 step here, ~20 % of its time). Active
 * waiting with a spin count of 1,000 (~25 µs) covers the gaps inside a step in both cases, and stays
 * short enough that two busy processes sharing the cores do not starve each other (the unthrottled
 * 7.5 ms did: see the README). libgomp reads these once, when it loads with the addon; the user's
 * own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins; and ours are removed again once the addon is loaded,
 * so child processes (the sandbox, the eager-PyTorch baseline) see the user's environment.
 */
function tuneOpenMP(): Array<keyof typeof OPENMP_WAIT> {
  if (process.env.OMP_WAIT_POLICY !== undefined || process.env.GOMP_SPINCOUNT !== undefined) return [];
  const keys = Object.keys(OPENMP_WAIT) as Array<keyof typeof OPENMP_WAIT>;
  for (const k of keys) process.env[k] = OPENMP_WAIT[k];
  return keys;
}

function defaultThreads(): number {
  const env = Number(process.env.SLM_TRAIN_THREADS);
  return Number.isInteger(env) && env > 0 ? env : availableParallelism();
}

/**
 * SLM_TRAIN_CPU_ISA caps the instruction set of the CPU kernels (the addon reads it when it loads);
 * a value it does not know would cap nothing, so it is refused here.
 */
function checkIsaCap(): void {
  const v = process.env.SLM_TRAIN_CPU_ISA;
  if (v === undefined || v === '' || (CPU_ISA_LEVELS as readonly string[]).includes(v)) return;
  throw new SlmError(
    'ARGUMENT_INVALID',
    `SLM_TRAIN_CPU_ISA must be one of ${CPU_ISA_LEVELS.join(', ')}, found '${v}'. Unset it to use everything the CPU offers (\`slm-train doctor\` shows the level).`,
  );
}

/**
 * SLM_TRAIN_CPU_CACHE: 0 turns the CPU tensor cache off, N caps it at N MiB (native/core/cpu_cache.h;
 * the addon reads it when it loads); anything else would be ignored there, so it is refused here.
 */
function checkCpuCache(): void {
  const v = process.env.SLM_TRAIN_CPU_CACHE;
  if (v === undefined || v === '' || /^\d{1,7}$/.test(v)) return;
  throw new SlmError(
    'ARGUMENT_INVALID',
    `SLM_TRAIN_CPU_CACHE must be 0 (the CPU tensor cache off) or its cap in MiB, found '${v}'. Unset it for the default (\`slm-train doctor\` shows the cache in force).`,
  );
}

/**
 * The allocator a server runs with: ATen's unless the user set SLM_TRAIN_CPU_CACHE to a value (after a burst of long
 * prompts the tensor cache would keep up to its cap of freed blocks resident, where glibc's trimmed heap
 * gives them back: test/serve-load.test.ts bounds a server's growth over a burst at 128 MiB, and with the
 * cache it measured +172 MiB once, 2026-11-27). `slm-train serve` applies it to its own environment before
 * the addon loads, `bench serve` to its server child's.
 */
export function serverAllocatorEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  // Empty counts as unset, as the addon reads it (an empty value would otherwise turn the cache on here).
  if (!env.SLM_TRAIN_CPU_CACHE) env.SLM_TRAIN_CPU_CACHE = '0';
  return env;
}

/** The addon, with threads set (libtorch starts with 1 thread here otherwise). */
export function native(): NativeAddon {
  if (configured) return loadAddon();
  checkIsaCap();
  checkCpuCache();
  tuneOpenBlas();
  const ours = tuneOpenMP();
  let a: NativeAddon;
  try {
    a = loadAddon();
  } finally {
    for (const k of ours) delete process.env[k];
  }
  a.setThreads(defaultThreads());
  configured = true;
  return a;
}

export function setThreads(n: number): void {
  if (!Number.isInteger(n) || n < 1) throw new SlmError('ARGUMENT_INVALID', `threads must be a positive integer, found ${n}.`);
  native().setThreads(n);
}
