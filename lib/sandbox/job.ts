/**
 * What the Python pool and the QuickJS sandbox share about one program: a program as they queue it
 * (Job), its limits with the defaults filled in and checked (resolveLimits), and its result as the
 * caller gets it (programResult).
 */
import { stripUndefined } from '../util/objects.js';
import { SlmError } from '../errors.js';
import type { SandboxLimits, SandboxResult, SearchTools, ToolCall } from './types.js';
import { DEFAULT_LIMITS, MAX_TIMEOUT_S, truncationMarker } from './types.js';

/** A program waiting for a worker, or handed to one. */
export interface Job {
  code: string;
  limits: Required<SandboxLimits>;
  tools?: SearchTools;
  globals?: Record<string, unknown>;
  finalAnswer?: boolean;
  /** Handed to a worker that died before it took the program, and queued again (Python pool). */
  retried?: boolean;
  resolve: (r: SandboxResult) => void;
  reject: (e: Error) => void;
}

/** Fills in defaults and checks every limit (a wrong value is an error, not silently clamped). */
export function resolveLimits(limits: SandboxLimits): Required<SandboxLimits> {
  const out = { ...DEFAULT_LIMITS, ...stripUndefined(limits) } as Required<SandboxLimits>;
  // One second above the wall limit: a single-threaded program meets the wall clock first; the CPU
  // limit stops a program whose threads burn several cores at once.
  if (out.cpuSeconds === undefined) out.cpuSeconds = Math.ceil(out.timeoutMs / 1000) + 1;
  for (const k of ['timeoutMs', 'cpuSeconds', 'memoryMb', 'maxOutputChars', 'maxCalls'] as const) {
    const v = out[k];
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)
      throw new SlmError('ARGUMENT_INVALID', `Expected a positive number for ${k} but received ${String(v)} (${typeof v}).`);
  }
  // Node's timers hold at most 2^31 - 1 ms; a longer one would fire at once.
  if (out.timeoutMs > MAX_TIMEOUT_S * 1000)
    throw new SlmError('ARGUMENT_INVALID', `Expected timeoutMs of at most ${MAX_TIMEOUT_S * 1000} (24 h) but received ${out.timeoutMs}.`);
  return out;
}

/** How a program ended, as an interpreter reports it. */
export interface ProgramEnd {
  stdout: string;
  truncated: boolean;
  timedOut: boolean;
  error: string | null;
  finalAnswer?: string;
}

/** The result of a program that started at `job.t0` and made `job.calls`: truncated output marked. */
export function programResult(job: Job & { calls: ToolCall[]; t0: number }, end: ProgramEnd): SandboxResult {
  return {
    ...(end.finalAnswer !== undefined ? { final_answer: end.finalAnswer } : {}),
    stdout: end.truncated ? end.stdout + truncationMarker(job.limits.maxOutputChars) : end.stdout,
    error: end.error,
    timed_out: end.timedOut,
    calls: job.calls,
    truncated: end.truncated,
    duration_ms: performance.now() - job.t0,
  };
}
