/**
 * A warm pool of Python workers (DESIGN §7). Each worker is python/sandbox_runner.py, started once
 * under the isolation wrapper that `detectIsolation()` found; it forks a fresh, locked-down child
 * for every program (see the runner's header for exactly what a program is held to). The host side
 * here adds what a program cannot influence:
 * - a backstop timer: a worker that has not answered `timeoutMs + 2 s` after a program started is
 *   killed (its whole process group, or namespace) and replaced;
 * - a worker that dies for any reason is replaced; the program it had taken (acknowledged) gets an
 *   error result, never a crash of this process; one it had not taken yet (it died while idle, its
 *   exit not seen yet when the program was handed to it) runs on another worker, once;
 * - `close()` ends every worker and waits until each one has exited.
 * One worker is lib/sandbox/python-worker.ts, the frames it exchanges lib/sandbox/python-wire.ts.
 */
import { randomUUID } from 'node:crypto';
import { SlmError } from '../errors.js';
import { checkRequiredIsolation, detectIsolationWithCaps, type RunnerCaps } from './isolation.js';
import { stripUndefined } from '../util/objects.js';
import { type Job, resolveLimits } from './job.js';
import { Worker, type WorkerPool } from './python-worker.js';
import { checkGlobals, type ExtraTools } from './tools.js';
import { checkTools } from '../extensions.js';
import type { IsolationLevel, IsolationReport, RunOptions, Sandbox, SandboxLimits, SandboxResult, SearchTools, ToolCall } from './types.js';

export interface PythonPoolOptions extends SandboxLimits {
  /** The search primitives programs may call (a program can also get its own through run()). */
  tools?: SearchTools;
  /**
   * Extra functions programs may call by name (sandbox.tools_module): JSON arguments, a JSON result
   * (or a promise of one); they run in this process, like the search tools.
   */
  extraTools?: ExtraTools;
  /** Number of warm workers (default: 2, at most the number of CPUs). */
  size?: number;
  /** The best isolation level to use (default 'bwrap'); lower levels are used when it does not work here. */
  maxLevel?: IsolationLevel;
  /**
   * The weakest isolation level to accept (default: any): below it createPythonPool() fails with
   * SANDBOX_ISOLATION_INSUFFICIENT and starts nothing. 'bwrap' is the one where programs cannot read
   * the host's files (see IsolationReport.readable).
   */
  requireIsolation?: IsolationLevel | null;
  /** Python executable (default: resolved by `resolvePython()`). */
  python?: string;
  /** Size of the private work directory under bubblewrap, in MiB (default 64). */
  workdirMb?: number;
  /** The unprivileged uid/gid programs run as when the worker starts as root (default 65534). */
  uid?: number;
  /**
   * Start even where nothing stops a program from signalling or reading other processes (no PID
   * namespace, no seccomp, no uid change). Default false: such a machine gets SANDBOX_UNAVAILABLE.
   */
  allowWeakIsolation?: boolean;
}

/** The warm pool. Create with `createPythonPool()`. */
export class PythonSandboxPool implements Sandbox, WorkerPool {
  readonly kind = 'python' as const;
  /** Appears on every worker's command line: lets tests and operators find this pool's processes. */
  readonly tag = `slm-sandbox-${randomUUID()}`;
  private workers = new Set<Worker>();
  private idle: Worker[] = [];
  private queue: Job[] = [];
  private closed = false;
  private startFailures = 0;
  private lastStartError?: Error;
  /** Workers started over the pool's life (the initial ones included). */
  started = 0;
  programs = 0;
  /** options.extraTools, checked, and their names (declared to the runner with every program). */
  readonly extraTools: ExtraTools | undefined;
  readonly extraToolNames: string[];

  constructor(
    readonly options: PythonPoolOptions,
    readonly isolation: IsolationReport,
    private caps: RunnerCaps,
    readonly size: number,
  ) {
    this.extraTools = options.extraTools ? checkTools(options.extraTools, 'extraTools', 'extraTools') : undefined;
    this.extraToolNames = Object.keys(this.extraTools ?? {});
  }

  /** Starts the workers and waits until all are ready. */
  async start(): Promise<void> {
    const ws: Worker[] = [];
    for (let i = 0; i < this.size; i++) ws.push(this.spawnWorker());
    try {
      await Promise.all(ws.map((w) => w.ready));
    } catch (e) {
      await this.close();
      throw e;
    }
  }

  run(code: string, opts: RunOptions = {}): Promise<SandboxResult> {
    if (this.closed)
      return Promise.reject(new SlmError('SANDBOX_ERROR', 'Expected an open sandbox pool but this one is closed; create a new one.'));
    if (typeof code !== 'string')
      return Promise.reject(new SlmError('ARGUMENT_INVALID', `Expected the program as a string but received ${typeof code}.`));
    let limits: Required<SandboxLimits>;
    let globals: Record<string, unknown> | undefined;
    try {
      limits = resolvePythonLimits({ ...this.options, ...stripUndefined(opts) });
      globals = checkGlobals(opts.globals);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.queue.push({
        code,
        limits,
        tools: opts.tools ?? this.options.tools,
        globals,
        finalAnswer: opts.finalAnswer === true,
        resolve,
        reject,
      });
      this.dispatch();
    });
  }

  private dispatch(): void {
    while (this.queue.length && this.idle.length) {
      const w = this.idle.shift()!; // least recently used first: it has had time to prepare its next child
      if (w.state !== 'idle') continue;
      const job = this.queue.shift()!;
      this.programs++;
      w.start(job);
    }
  }

  private spawnWorker(): Worker {
    const w = new Worker(this, this.isolation.level, this.caps);
    this.workers.add(w);
    this.started++;
    w.ready.then(
      () => {
        this.startFailures = 0;
        if (this.closed) return w.kill();
        this.idle.push(w);
        this.dispatch();
      },
      (e: Error) => {
        this.startFailures++;
        this.lastStartError = e;
      },
    );
    return w;
  }

  /** @internal */
  workerIdle(worker: Worker): void {
    if (this.closed) {
      worker.send({ t: 'exit' });
      return;
    }
    this.idle.push(worker);
    this.dispatch();
  }

  /** @internal A program whose worker died before taking it: first in the queue again (not when closed). */
  retry(job: Job): boolean {
    if (this.closed) return false;
    this.queue.unshift(job);
    this.dispatch();
    return true;
  }

  /** @internal A worker exited (killed, crashed, or closed): replace it unless closing. */
  workerGone(worker: Worker): void {
    this.workers.delete(worker);
    this.idle = this.idle.filter((x) => x !== worker);
    if (this.closed) return;
    if (this.startFailures >= 3) {
      const err = new SlmError(
        'SANDBOX_UNAVAILABLE',
        `Expected sandbox workers to start but the last 3 attempts failed: ${this.lastStartError?.message ?? 'unknown error'}`,
      );
      for (const job of this.queue.splice(0)) job.reject(err);
      if (this.workers.size === 0) this.closed = true;
      return;
    }
    this.spawnWorker();
  }

  /** Process ids of the live workers (the wrapper's, where there is one): for diagnostics and tests. */
  workerPids(): number[] {
    return [...this.workers].map((w) => w.proc.pid).filter((p): p is number => p !== undefined);
  }

  /**
   * The live workers, for diagnostics and tests: process id (the wrapper's, where there is one), state,
   * and the program running there (its tool calls so far; whether the worker acknowledged it).
   */
  workerStates(): Array<{
    pid: number | undefined;
    state: Worker['state'];
    program: { calls: readonly ToolCall[]; started: boolean } | null;
  }> {
    return [...this.workers].map((w) => ({
      pid: w.proc.pid,
      state: w.state,
      program: w.current ? { calls: w.current.calls, started: w.current.started } : null,
    }));
  }

  /** Ends every worker (asks politely, then kills the process group) and waits until all have exited. */
  async close(): Promise<void> {
    this.closed = true;
    const err = new SlmError('SANDBOX_ERROR', 'The sandbox pool was closed before this program could run.');
    for (const job of this.queue.splice(0)) job.reject(err);
    const all = [...this.workers];
    for (const w of all) if (w.state === 'idle') w.send({ t: 'exit' });
    const timer = setTimeout(() => all.forEach((w) => w.kill()), 500);
    for (const w of all) if (w.state !== 'idle') w.kill();
    await Promise.all(all.map((w) => w.exited));
    clearTimeout(timer);
  }
}

function resolvePythonLimits(l: SandboxLimits): Required<SandboxLimits> {
  const out = resolveLimits(l);
  if (out.memoryMb < 64)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected memoryMb of at least 64 for Python (the interpreter itself needs that much) but received ${out.memoryMb}.`,
    );
  return out;
}

/** Detects the isolation level, starts `size` workers and waits until they are ready. */
export async function createPythonPool(opts: PythonPoolOptions = {}): Promise<PythonSandboxPool> {
  resolvePythonLimits(opts); // fail early on a bad limit
  const iso = await detectIsolationWithCaps({ python: opts.python, maxLevel: opts.maxLevel });
  const { caps, ...isolation } = iso;
  checkRequiredIsolation(isolation, opts.requireIsolation, 'requireIsolation');
  if (isolation.level === 'rlimits-only' && !isolation.seccomp && !isolation.uidDrop && !opts.allowWeakIsolation) {
    throw new SlmError(
      'SANDBOX_UNAVAILABLE',
      `Expected a way to contain programs (bubblewrap or unshare namespaces, a seccomp filter, or an unprivileged uid) but found none: ${isolation.details}. ` +
        'Install bubblewrap (apt-get install bubblewrap), or pass allowWeakIsolation: true to run programs with resource limits only.',
    );
  }
  const cpus = (await import('node:os')).availableParallelism();
  const size = opts.size ?? Math.max(1, Math.min(2, cpus));
  if (!Number.isInteger(size) || size < 1)
    throw new SlmError('ARGUMENT_INVALID', `Expected a positive integer for size but received ${String(size)}.`);
  const pool = new PythonSandboxPool(opts, isolation, caps, size);
  await pool.start();
  return pool;
}

/** Runs one program in a freshly started worker (no pool): what a per-program spawn costs. */
export async function runPythonOnce(code: string, opts: PythonPoolOptions = {}): Promise<SandboxResult> {
  const pool = await createPythonPool({ ...opts, size: 1 });
  try {
    return await pool.run(code);
  } finally {
    await pool.close();
  }
}
