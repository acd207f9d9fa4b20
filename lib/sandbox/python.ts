/**
 * A warm pool of Python workers (DESIGN §7). Each worker is python/sandbox_runner.py, started once
 * under the isolation wrapper that `detectIsolation()` found; it forks a fresh, locked-down child
 * for every program (see the runner's header for exactly what a program is held to). The host side
 * here adds what a program cannot influence:
 * - a backstop timer: a worker that has not answered `timeoutMs + 2 s` after a program started is
 *   killed (its whole process group, or namespace) and replaced;
 * - a worker that dies for any reason is replaced; its program gets an error result, never a crash
 *   of this process;
 * - `close()` ends every worker and waits until each one has exited.
 * Frames on the worker's stdin/stdout: 4-byte big-endian length + MessagePack (msgpackr, plain maps).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Packr } from 'msgpackr';
import { SlmError } from '../errors.js';
import { BWRAP_WORKDIR, checkRequiredIsolation, detectIsolationWithCaps, type RunnerCaps, WORKER_ENV, wrapperCommand } from './isolation.js';
import { checkGlobals, invokeTool, type ExtraTools } from './tools.js';
import { checkTools } from '../extensions.js';
import type { IsolationLevel, IsolationReport, RunOptions, Sandbox, SandboxLimits, SandboxResult, SearchTools, ToolCall } from './types.js';
import { DEFAULT_LIMITS, truncationMarker } from './types.js';

const packr = new Packr({ moreTypes: true, useRecords: false, encodeUndefinedAsNil: true, int64AsType: 'number' });
const MAX_FRAME = 64 * 1024 * 1024;
const BACKSTOP_MS = 2000;
const STARTUP_TIMEOUT_MS = 20_000;

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

interface Job {
  code: string;
  limits: Required<SandboxLimits>;
  tools?: SearchTools;
  globals?: Record<string, unknown>;
  finalAnswer?: boolean;
  resolve: (r: SandboxResult) => void;
  reject: (e: Error) => void;
}

interface Running extends Job {
  id: number;
  calls: ToolCall[];
  t0: number;
  backstop: NodeJS.Timeout;
}

type Msg = Record<string, unknown>;

/** Splits a byte stream into length-prefixed frames. */
class FrameDecoder {
  private chunks: Buffer[] = [];
  private length = 0;
  constructor(private onFrame: (payload: Buffer) => void) {}
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.length += chunk.length;
    for (;;) {
      if (this.length < 4) return;
      if (this.chunks[0].length < 4) this.chunks = [Buffer.concat(this.chunks)];
      const n = this.chunks[0].readUInt32BE(0);
      if (n > MAX_FRAME) throw new Error(`frame of ${n} bytes exceeds the ${MAX_FRAME}-byte limit`);
      if (this.length < 4 + n) return;
      const all = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks);
      this.onFrame(all.subarray(4, 4 + n));
      const rest = all.subarray(4 + n);
      this.chunks = rest.length ? [rest] : [];
      this.length = rest.length;
    }
  }
}

function encodeFrame(msg: Msg): Buffer {
  const body = packr.pack(msg);
  const head = Buffer.allocUnsafe(4);
  head.writeUInt32BE(body.length, 0);
  return Buffer.concat([head, body]);
}

let nextWorkerSerial = 0;

class Worker {
  readonly proc: ChildProcess;
  readonly serial = ++nextWorkerSerial;
  state: 'starting' | 'idle' | 'busy' | 'dead' = 'starting';
  ready: Promise<Msg>;
  current?: Running;
  exited: Promise<void>;
  private stderrTail = '';
  private nextId = 1;
  private hostDir?: string;

  constructor(
    private pool: PythonSandboxPool,
    level: IsolationLevel,
    caps: RunnerCaps,
  ) {
    const opts = pool.options;
    let workdir = BWRAP_WORKDIR;
    if (level !== 'bwrap') workdir = this.hostDir = mkdtempSync(join(tmpdir(), 'slm-sandbox-'));
    const config = JSON.stringify({ workdir, uid: opts.uid ?? 65534, gid: opts.uid ?? 65534, require_seccomp: pool.isolation.seccomp });
    const { file, args } = wrapperCommand(level, pool.isolation.python, caps, ['--config', config, '--tag', pool.tag], opts.workdirMb ?? 64);
    // detached: the worker leads its own process group, so one kill reaches everything it started.
    this.proc = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'], env: WORKER_ENV, detached: true, cwd: '/' });
    this.exited = new Promise((res) => this.proc.once('close', () => res()));
    let readyResolve!: (m: Msg) => void;
    let readyReject!: (e: Error) => void;
    this.ready = new Promise((res, rej) => {
      readyResolve = res;
      readyReject = rej;
    });
    this.ready.catch(() => {});
    const startTimer = setTimeout(() => {
      readyReject(new SlmError('SANDBOX_UNAVAILABLE', `Expected a sandbox worker to start within ${STARTUP_TIMEOUT_MS / 1000} s but it did not. ${this.diagnostics()}`));
      this.kill();
    }, STARTUP_TIMEOUT_MS);
    const decoder = new FrameDecoder((payload) => {
      let msg: Msg;
      try {
        msg = packr.unpack(payload) as Msg;
      } catch (e) {
        this.fail(`undecodable frame from the worker (${(e as Error).message})`);
        return;
      }
      if (msg.t === 'ready') {
        clearTimeout(startTimer);
        this.state = 'idle';
        readyResolve(msg);
      } else this.onMessage(msg);
    });
    this.proc.stdout!.on('data', (chunk: Buffer) => {
      try {
        decoder.push(chunk);
      } catch (e) {
        this.fail((e as Error).message);
      }
    });
    this.proc.stderr!.on('data', (chunk: Buffer) => {
      this.stderrTail = (this.stderrTail + chunk.toString('utf8')).slice(-2000);
    });
    this.proc.stdin!.on('error', () => {}); // EPIPE when the worker died; 'close' handles it
    this.proc.once('close', (code, signal) => {
      clearTimeout(startTimer);
      const wasStarting = this.state === 'starting';
      this.state = 'dead';
      if (wasStarting) readyReject(new SlmError('SANDBOX_UNAVAILABLE', `Expected a sandbox worker to start but it exited (${signal ?? 'code ' + code}). ${this.diagnostics()}`));
      if (this.hostDir) rmSync(this.hostDir, { recursive: true, force: true });
      const running = this.current;
      this.current = undefined;
      if (running) {
        clearTimeout(running.backstop);
        running.resolve(this.result(running, { error: `SandboxError: the sandbox worker died (${signal ?? 'exit code ' + code}) while running the program; it was replaced`, stdout: '', timed_out: false, truncated: false }));
      }
      this.pool.workerGone(this);
    });
  }

  diagnostics(): string {
    const tail = this.stderrTail.trim();
    return tail ? `Worker stderr: ${tail.split('\n').slice(-5).join(' | ')}` : 'The worker wrote nothing to stderr.';
  }

  send(msg: Msg): void {
    if (this.state !== 'dead' && this.proc.stdin!.writable) this.proc.stdin!.write(encodeFrame(msg));
  }

  start(job: Job): void {
    const id = this.nextId++;
    const backstop = setTimeout(() => {
      const running = this.current;
      if (!running || running.id !== id) return;
      this.current = undefined;
      running.resolve(this.result(running, { stdout: '', truncated: false, timed_out: true, error: `TimeoutError: the program exceeded the time limit of ${job.limits.timeoutMs / 1000} s (the worker did not answer and was replaced)` }));
      this.kill();
    }, job.limits.timeoutMs + BACKSTOP_MS);
    this.current = { ...job, id, calls: [], t0: performance.now(), backstop };
    this.state = 'busy';
    this.send({
      t: 'run',
      id,
      code: job.code,
      timeout_ms: job.limits.timeoutMs,
      cpu_s: job.limits.cpuSeconds,
      memory_mb: job.limits.memoryMb,
      max_output: job.limits.maxOutputChars,
      ...(job.globals ? { globals: job.globals } : {}),
      ...(job.finalAnswer ? { final_answer: true } : {}),
      ...(this.pool.extraToolNames.length ? { extra_tools: this.pool.extraToolNames } : {}),
    });
  }

  private onMessage(msg: Msg): void {
    const running = this.current;
    if (msg.t === 'call') {
      if (!running) return this.fail('a tool call arrived while no program was running');
      const { id } = running;
      void Promise.resolve(invokeTool(running.tools, msg.name, msg.args, running.calls, running.limits.maxCalls, this.pool.extraTools)).then((reply) => {
        if (this.current?.id !== id) return; // the program already ended
        this.send({ t: 'ret', id, seq: msg.seq, ...reply });
      });
    } else if (msg.t === 'done') {
      if (!running || msg.id !== running.id) return; // a late answer for a program the backstop already ended
      clearTimeout(running.backstop);
      this.current = undefined;
      this.state = 'idle';
      running.resolve(
        this.result(running, {
          stdout: typeof msg.stdout === 'string' ? msg.stdout : '',
          truncated: msg.truncated === true,
          timed_out: msg.timed_out === true,
          error: typeof msg.error === 'string' ? msg.error : null,
          ...(running.finalAnswer && typeof msg.final_answer === 'string' ? { final_answer: msg.final_answer } : {}),
        }),
      );
      this.pool.workerIdle(this);
    } else this.fail(`unexpected frame ${JSON.stringify(msg.t)} from the worker`);
  }

  private result(running: Running, r: Pick<SandboxResult, 'stdout' | 'error' | 'timed_out' | 'truncated' | 'final_answer'>): SandboxResult {
    return {
      ...(r.final_answer !== undefined ? { final_answer: r.final_answer } : {}),
      stdout: r.truncated ? r.stdout + truncationMarker(running.limits.maxOutputChars) : r.stdout,
      error: r.error,
      timed_out: r.timed_out,
      calls: running.calls,
      truncated: r.truncated,
      duration_ms: performance.now() - running.t0,
    };
  }

  /** Protocol trouble: the worker cannot be trusted any more. */
  private fail(why: string): void {
    this.stderrTail += `\n[host] ${why}`;
    this.kill();
  }

  /** SIGKILL to the worker's whole process group (bubblewrap/unshare take their namespace with them). */
  kill(): void {
    if (this.proc.pid === undefined || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    try {
      process.kill(-this.proc.pid, 'SIGKILL');
    } catch {
      try {
        this.proc.kill('SIGKILL');
      } catch {
        /* already gone */
      }
    }
  }
}

/** The warm pool. Create with `createPythonPool()`. */
export class PythonSandboxPool implements Sandbox {
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
    if (this.closed) return Promise.reject(new SlmError('SANDBOX_ERROR', 'Expected an open sandbox pool but this one is closed; create a new one.'));
    if (typeof code !== 'string') return Promise.reject(new SlmError('ARGUMENT_INVALID', `Expected the program as a string but received ${typeof code}.`));
    let limits: Required<SandboxLimits>;
    let globals: Record<string, unknown> | undefined;
    try {
      limits = resolvePythonLimits({ ...this.options, ...stripUndefined(opts) });
      globals = checkGlobals(opts.globals);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.queue.push({ code, limits, tools: opts.tools ?? this.options.tools, globals, finalAnswer: opts.finalAnswer === true, resolve, reject });
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
  workerIdle(w: Worker): void {
    if (this.closed) return w.send({ t: 'exit' });
    this.idle.push(w);
    this.dispatch();
  }

  /** @internal A worker exited (killed, crashed, or closed): replace it unless closing. */
  workerGone(w: Worker): void {
    this.workers.delete(w);
    this.idle = this.idle.filter((x) => x !== w);
    if (this.closed) return;
    if (this.startFailures >= 3) {
      const err = new SlmError('SANDBOX_UNAVAILABLE', `Expected sandbox workers to start but the last 3 attempts failed: ${this.lastStartError?.message ?? 'unknown error'}`);
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

function stripUndefined<T extends object>(o: T): Partial<T> {
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

function resolvePythonLimits(l: SandboxLimits): Required<SandboxLimits> {
  const out = resolveLimits(l);
  if (out.memoryMb < 64) throw new SlmError('ARGUMENT_INVALID', `Expected memoryMb of at least 64 for Python (the interpreter itself needs that much) but received ${out.memoryMb}.`);
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
  if (!Number.isInteger(size) || size < 1) throw new SlmError('ARGUMENT_INVALID', `Expected a positive integer for size but received ${String(size)}.`);
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
