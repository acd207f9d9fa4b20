/** The sandboxes that run model-written programs (DESIGN §7). */
import type { SearchTools } from '../retrieval/types.js';

export type { SearchTools };

/** The three primitives a program may call, in this order everywhere (help texts, logs). */
export const TOOL_NAMES = ['search_pages', 'view_sections', 'read_section'] as const;
export type ToolName = (typeof TOOL_NAMES)[number];

/** One call a program made to a search primitive, in the order made. */
export interface ToolCall {
  name: string;
  args: unknown[];
  /** false when the tool threw, the arguments were wrong or too large (MAX_TOOL_ARGS_CHARS: recorded without them), or the call limit was reached. */
  ok: boolean;
  /** Host-side time spent answering, in milliseconds. */
  ms: number;
}

/** What running one program produced. Printed output is kept even when the program raised. */
export interface SandboxResult {
  /** Everything the program printed (stdout and stderr interleaved), capped; ends with a marker when capped. */
  stdout: string;
  /** The exception's last line (`NameError: name 'x' is not defined`), or null when the program ran to its end. */
  error: string | null;
  /** The wall-clock or CPU limit ended the program. */
  timed_out: boolean;
  calls: ToolCall[];
  /** The output cap was reached (the marker is then at the end of `stdout`). */
  truncated: boolean;
  /** Wall time from the program's start to its result, in milliseconds (queueing not included). */
  duration_ms: number;
  /** What the program passed to final_answer() (as text, capped like the output); only with RunOptions.finalAnswer. */
  final_answer?: string;
}

/** Per-program limits; every field has a default (see DEFAULT_LIMITS). */
export interface SandboxLimits {
  /** Wall-clock limit; the program is killed when it passes. */
  timeoutMs?: number;
  /** CPU-time limit (Python: RLIMIT_CPU of the program's process). Defaults to the wall limit + 1 s, rounded up. */
  cpuSeconds?: number;
  /** Address-space limit (Python: RLIMIT_AS) or heap limit (QuickJS), in MiB. */
  memoryMb?: number;
  /** Output cap in characters; the rest is dropped and a marker appended. */
  maxOutputChars?: number;
  /** Tool calls allowed per program; later calls fail with an error the program sees (the first of them recorded, the rest not). */
  maxCalls?: number;
}

export interface RunOptions extends SandboxLimits {
  /** Tools for this program only (default: the sandbox's own). */
  tools?: SearchTools;
  /**
   * Global variables for this program only, as JSON values (the code protocol binds the episode's
   * question this way when `protocol.question_variable` is set). Names must be identifiers and may
   * not shadow the search primitives.
   */
  globals?: Record<string, unknown>;
  /**
   * Define `final_answer(answer)` for this program (smolagents' CodeAgent has it): the call ends the
   * program, which then counts as having run to its end, and the result carries the answer as text.
   */
  finalAnswer?: boolean;
}

/**
 * The longest timeout slm-train accepts anywhere (24 h, in seconds): a program, a request or a
 * collective that needs longer is a mistake, and Node's timers hold at most 2^31 - 1 ms (~24.8 days;
 * past that a timer fires after 1 ms).
 */
export const MAX_TIMEOUT_S = 86_400;

export const DEFAULT_LIMITS: Required<Omit<SandboxLimits, 'cpuSeconds'>> = {
  timeoutMs: 10_000,
  memoryMb: 512,
  maxOutputChars: 10_000,
  maxCalls: 1000,
};

export function truncationMarker(maxOutputChars: number): string {
  return `\n...[output truncated at ${maxOutputChars} chars]`;
}

export type SandboxKind = 'python' | 'quickjs';

/** What both backends offer. `close()` releases every process / WebAssembly instance; run() then rejects. */
export interface Sandbox {
  readonly kind: SandboxKind;
  run(code: string, opts?: RunOptions): Promise<SandboxResult>;
  close(): Promise<void>;
}

export type IsolationLevel = 'bwrap' | 'unshare' | 'rlimits-only';

/** What `detectIsolation()` found; `slm-train doctor` and run logs print it. */
export interface IsolationReport {
  /** The wrapper the Python workers run in: bubblewrap, util-linux unshare, or none (limits only). */
  level: IsolationLevel;
  /** Programs cannot reach the network (own network namespace, or sockets denied by seccomp). */
  network: boolean;
  /** Programs cannot write outside their working directory. */
  readonlyFs: boolean;
  /**
   * The filesystem is an allow-list (bubblewrap): a program sees only what the interpreter needs and
   * its working directory; no file of the host (run folder, corpus, questions, project) is readable.
   */
  hostFilesHidden: boolean;
  /**
   * Exactly what a program can read, as the words after "a program can read" (the run log,
   * `slm-train exec` and `slm-train doctor` print it).
   */
  readable: string;
  /** The seccomp filter is in force (no fork/exec/sockets, no memfd or SysV shared memory, signals only to the program itself). */
  seccomp: boolean;
  /** Programs run under an unprivileged uid (only possible when the worker starts as root). */
  uidDrop: boolean;
  /** The real Python executable the workers run, and its version (e.g. "3.11.7"). */
  python: string;
  pythonVersion: string;
  /** One line for people. */
  details: string;
}
