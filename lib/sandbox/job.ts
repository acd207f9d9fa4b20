/**
 * What the Python pool and the QuickJS sandbox share about one program: a program as they queue it
 * (Job), and its limits with the defaults filled in and checked (resolveLimits).
 */
import { SlmError } from '../errors.js';
import type { SandboxLimits, SandboxResult, SearchTools } from './types.js';
import { DEFAULT_LIMITS } from './types.js';

/** A program waiting for a worker, or handed to one. */
export interface Job {
  code: string;
  limits: Required<SandboxLimits>;
  tools?: SearchTools;
  globals?: Record<string, unknown>;
  finalAnswer?: boolean;
  resolve: (r: SandboxResult) => void;
  reject: (e: Error) => void;
}

/** `o` without its undefined fields (so that they do not override defaults when spread). */
export function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** Fills in defaults and checks every limit (a wrong value is an error, not silently clamped). */
export function resolveLimits(l: SandboxLimits): Required<SandboxLimits> {
  const out = { ...DEFAULT_LIMITS, ...stripUndefined(l) } as Required<SandboxLimits>;
  // One second above the wall limit: a single-threaded program meets the wall clock first; the CPU
  // limit stops a program whose threads burn several cores at once.
  if (out.cpuSeconds === undefined) out.cpuSeconds = Math.ceil(out.timeoutMs / 1000) + 1;
  for (const k of ['timeoutMs', 'cpuSeconds', 'memoryMb', 'maxOutputChars', 'maxCalls'] as const) {
    const v = out[k];
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw new SlmError('ARGUMENT_INVALID', `Expected a positive number for ${k} but received ${String(v)} (${typeof v}).`);
  }
  return out;
}
