/**
 * The QuickJS sandbox (DESIGN §7): JavaScript programs run in QuickJS compiled to WebAssembly, so a
 * program has no file system, network, processes or host objects at all, only what is installed:
 * `search_pages`, `view_sections`, `read_section` (synchronous functions returning JSON values),
 * `console.log` / `print` (captured, capped), and the ECMAScript built-ins except ArrayBuffer and the
 * typed arrays (their storage escapes QuickJS's memory accounting).
 *
 * Where it runs: each interpreter lives in its own worker thread (the plain synchronous QuickJS
 * build, a fresh runtime and context per program, every handle disposed). The main thread never runs
 * program code, so a program can never block the host's event loop.
 *
 * Tool calls: the worker posts the call and blocks in `Atomics.wait`; the host answers (its tools may
 * be synchronous or asynchronous), posts the reply on a dedicated port and wakes the worker, which
 * takes the reply with `receiveMessageOnPort`. So tools look synchronous to programs everywhere,
 * inside promise continuations too.
 *
 * Limits: the wall-clock deadline is enforced three ways: QuickJS's interrupt handler (polled while
 * bytecode runs), the wait for a tool reply (bounded by the deadline), and, for a program stuck inside
 * a long native builtin where neither can act, the host terminating the worker thread shortly after the
 * deadline (a new worker is started for the next program). Heap (`setMemoryLimit`) and interpreter
 * stack (`setMaxStackSize`) are limited per program. QuickJS polls the interrupt handler rarely during
 * allocation-heavy code and collects garbage repeatedly near the heap limit, so some memory bombs end
 * with `out of memory` and others with the host's termination at the deadline; both are contained. Anything unexpected inside the worker (an abort
 * of the WebAssembly module, e.g. on a leaked handle) ends that worker only, never the host.
 */
import { createRequire } from 'node:module';
import { MessageChannel, type MessagePort, Worker } from 'node:worker_threads';
import { SlmError } from '../errors.js';
import { resolveLimits } from './python.js';
import { checkGlobals, invokeTool, type ExtraTools } from './tools.js';
import { checkTools } from '../extensions.js';
import type { RunOptions, Sandbox, SandboxLimits, SandboxResult, SearchTools, ToolCall } from './types.js';
import { TOOL_NAMES, truncationMarker } from './types.js';

export interface QuickJSSandboxOptions extends SandboxLimits {
  tools?: SearchTools;
  /** Extra functions programs may call by name (sandbox.tools_module): JSON arguments, a JSON result; they run in this process. */
  extraTools?: ExtraTools;
  /** Interpreter stack limit in KiB (16 to 1024, default 256): deep recursion ends with `InternalError: stack overflow`. */
  stackKb?: number;
  /** Worker threads, i.e. programs that can run at the same time (default 1). */
  size?: number;
}

/** QuickJS heap default in MiB (the interpreter itself needs well under 1 MiB). */
const QUICKJS_DEFAULT_MEMORY_MB = 64;
const DEFAULT_STACK_KB = 256;
const MAX_STACK_KB = 1024;
/** After the deadline, how long a worker may take to notice it before the host terminates it. */
const GRACE_MS = 1000;
const STARTUP_TIMEOUT_MS = 20_000;

interface JobMsg {
  t: 'run';
  id: number;
  code: string;
  timeoutMs: number;
  memoryMb: number;
  maxOutputChars: number;
  stackKb: number;
  globals?: Record<string, unknown>;
  finalAnswer?: boolean;
}
interface DoneMsg {
  t: 'done';
  id: number;
  stdout: string;
  truncated: boolean;
  error: string | null;
  timedOut: boolean;
  /** The worker's own machinery failed: it must be replaced. */
  hostFailure: string | null;
  /** What the program passed to final_answer(), as text; null when it did not call it. */
  finalAnswer: string | null;
}
interface CallMsg {
  t: 'call';
  id: number;
  seq: number;
  name: string;
  args: unknown[];
}

/**
 * The worker thread's code. It is sent as source text (`workerMain.toString()`), so it must not use
 * anything from this module's scope: everything arrives through `workerData`.
 */
async function workerMain(): Promise<void> {
  /* eslint-disable @typescript-eslint/no-require-imports */
  const { parentPort, workerData, receiveMessageOnPort } = require('node:worker_threads') as typeof import('node:worker_threads');
  const qjs = require(workerData.quickjsPath) as typeof import('quickjs-emscripten');
  const QuickJS = await qjs.newQuickJSWASMModule();
  const replyPort: MessagePort = workerData.replyPort;
  const flag = new Int32Array(workerData.flag as SharedArrayBuffer);
  const toolNames: string[] = workerData.toolNames;
  const prelude: string = workerData.prelude;
  let seq = 0;

  parentPort!.on('message', (job: JobMsg) => {
    if (job && job.t === 'run') parentPort!.postMessage(run(job));
  });
  parentPort!.postMessage({ t: 'ready' });

  function run(job: JobMsg): DoneMsg {
    const deadline = Date.now() + job.timeoutMs;
    let timedOut = false;
    const parts: string[] = [];
    let chars = 0;
    let truncated = false;
    let error: string | null = null;
    let hostFailure: string | null = null;
    let finalText: string | null = null;
    const write = (s: string) => {
      if (truncated) return;
      if (chars + s.length > job.maxOutputChars) {
        s = s.slice(0, job.maxOutputChars - chars);
        truncated = true;
      }
      parts.push(s);
      chars += s.length;
    };

    /** Blocks until the host answers, or until the deadline. */
    const callHost = (name: string, args: unknown[]): { ok: boolean; value?: unknown; error?: string; etype?: string } => {
      const my = ++seq;
      parentPort!.postMessage({ t: 'call', id: job.id, seq: my, name, args } satisfies CallMsg);
      for (;;) {
        for (let m = receiveMessageOnPort(replyPort); m; m = receiveMessageOnPort(replyPort)) {
          if (m.message && m.message.seq === my) return m.message;
        }
        const left = deadline - Date.now();
        if (left <= 0) {
          timedOut = true;
          return { ok: false, etype: 'RuntimeError', error: 'the time limit passed while waiting for the search tool' };
        }
        Atomics.store(flag, 0, 0);
        // Re-check after clearing the flag, so that a reply posted just before cannot be missed.
        const again = receiveMessageOnPort(replyPort);
        if (again && again.message && again.message.seq === my) return again.message;
        Atomics.wait(flag, 0, 0, left);
      }
    };

    const rt = QuickJS.newRuntime();
    rt.setMemoryLimit(job.memoryMb * 1024 * 1024);
    rt.setMaxStackSize(job.stackKb * 1024);
    rt.setInterruptHandler(() => (timedOut = timedOut || Date.now() > deadline));
    // No ArrayBuffer/typed arrays: their storage is not counted against QuickJS's memory limit, so a
    // program could grow the host's memory until the deadline. Search programs have no use for them.
    const vm = rt.newContext({ intrinsics: { ...qjs.DefaultIntrinsics, TypedArrays: false } });
    const describe = (h: import('quickjs-emscripten').QuickJSHandle): string => {
      let v: unknown;
      try {
        v = vm.dump(h);
      } catch {
        v = '(an exception that could not be read)';
      } finally {
        if (h.alive) h.dispose();
      }
      if (v && typeof v === 'object' && 'message' in v) {
        const e = v as { name?: unknown; message?: unknown };
        return `${typeof e.name === 'string' ? e.name : 'Error'}: ${String(e.message)}`;
      }
      if (v === null) return 'InternalError: out of memory';
      return `Uncaught ${typeof v === 'string' ? JSON.stringify(v) : String(v)}`;
    };
    const toHandle = (v: unknown): import('quickjs-emscripten').QuickJSHandle => {
      if (v === null || v === undefined) return vm.null;
      if (typeof v === 'string') return vm.newString(v);
      if (typeof v === 'number') return vm.newNumber(v);
      if (typeof v === 'boolean') return v ? vm.true : vm.false;
      const container = Array.isArray(v) ? vm.newArray() : vm.newObject();
      const entries: [string | number, unknown][] = Array.isArray(v) ? v.map((x, i) => [i, x]) : Object.entries(v as object);
      for (const [k, x] of entries) {
        const h = toHandle(x);
        vm.setProp(container, k, h);
        h.dispose();
      }
      return container;
    };
    try {
      const w = vm.newFunction('write', (h) => {
        if (!truncated) write(vm.getString(h));
        return truncated ? vm.true : vm.false; // once full, console.log stops calling out
      });
      vm.setProp(vm.global, '__slm_write', w);
      w.dispose();
      const p = vm.evalCode(prelude, 'prelude.js');
      if (p.error) throw new Error(`prelude failed: ${describe(p.error)}`);
      p.value.dispose();
      for (const name of toolNames) {
        const fn = vm.newFunction(name, (...handles) => {
          const reply = callHost(name, handles.map((h) => vm.dump(h)));
          if (reply.ok) return toHandle(reply.value);
          return { error: vm.newError({ name: reply.etype === 'TypeError' ? 'TypeError' : 'Error', message: String(reply.error) }) };
        });
        vm.setProp(vm.global, name, fn);
        fn.dispose();
      }
      if (job.finalAnswer) {
        // final_answer(x) records x as text and throws to end the program (a program that catches it
        // still ends with that answer: the first call counts).
        const fn = vm.newFunction('final_answer', (h) => {
          if (finalText === null) {
            const v = h === undefined ? undefined : vm.dump(h);
            const text = typeof v === 'string' ? v : (JSON.stringify(v) ?? String(v));
            finalText = text.slice(0, job.maxOutputChars);
          }
          return { error: vm.newError({ name: 'FinalAnswer', message: 'the program gave its final answer' }) };
        });
        vm.setProp(vm.global, 'final_answer', fn);
        fn.dispose();
      }
      for (const [name, v] of Object.entries(job.globals ?? {})) {
        const h = toHandle(v);
        vm.setProp(vm.global, name, h);
        h.dispose();
      }
      const res = vm.evalCode(job.code, 'program.js');
      if (res.error) error = describe(res.error);
      else res.value.dispose();
      // Promise continuations (async functions, then-callbacks) run here, under the same deadline.
      while (error === null && finalText === null && !timedOut && rt.hasPendingJob()) {
        const r = rt.executePendingJobs();
        if (r.error) error = describe(r.error);
      }
    } catch (e) {
      hostFailure = String((e as Error)?.message ?? e);
    }
    if (!hostFailure) {
      try {
        vm.dispose();
        rt.dispose();
      } catch (e) {
        hostFailure = `dispose failed: ${String((e as Error)?.message ?? e)}`;
      }
    }
    if (timedOut) error = `TimeoutError: the program exceeded the time limit of ${job.timeoutMs / 1000} s`;
    else if (finalText !== null) error = null;
    return { t: 'done', id: job.id, stdout: parts.join(''), truncated, error, timedOut, hostFailure, finalAnswer: finalText };
  }
}

/** Defines console/print over the host's write function, then removes that function from the global object. */
const PRELUDE = `(() => {
  const write = globalThis.__slm_write;
  delete globalThis.__slm_write;
  let full = false;
  const show = (v) => {
    if (typeof v === 'string') return v;
    if (v instanceof Error) return String(v);
    if (typeof v === 'function') return '[Function ' + (v.name || 'anonymous') + ']';
    try { const s = JSON.stringify(v); return s === undefined ? String(v) : s; } catch (e) { return String(v); }
  };
  const log = (...args) => { if (!full) full = write(args.map(show).join(' ') + '\\n'); };
  globalThis.console = { log, info: log, warn: log, error: log, debug: log };
  globalThis.print = log;
})();`;

const WORKER_SOURCE = `(${workerMain.toString()})().catch((e) => { require('node:worker_threads').parentPort.postMessage({ t: 'fatal', message: String(e && e.stack || e) }); });`;

interface Job {
  code: string;
  limits: Required<SandboxLimits>;
  tools?: SearchTools;
  globals?: Record<string, unknown>;
  finalAnswer?: boolean;
  resolve: (r: SandboxResult) => void;
  reject: (e: Error) => void;
}

class QjsWorker {
  readonly worker: Worker;
  readonly ready: Promise<void>;
  readonly exited: Promise<void>;
  private replyPort: MessagePort;
  private flag = new Int32Array(new SharedArrayBuffer(4));
  current?: Job & { id: number; calls: ToolCall[]; t0: number; timer: NodeJS.Timeout };
  dead = false;
  private nextId = 1;

  constructor(private owner: QuickJSSandbox) {
    const { port1, port2 } = new MessageChannel();
    this.replyPort = port1;
    this.worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: { quickjsPath: quickjsPath(), replyPort: port2, flag: this.flag.buffer, toolNames: [...TOOL_NAMES, ...owner.extraToolNames], prelude: PRELUDE },
      transferList: [port2],
      resourceLimits: { maxOldGenerationSizeMb: 256, stackSizeMb: 8 },
      stdout: true,
      stderr: true,
    });
    this.worker.stdout.resume();
    this.worker.stderr.resume();
    this.exited = new Promise((res) => this.worker.once('exit', () => res()));
    this.ready = new Promise((res, rej) => {
      const timer = setTimeout(() => rej(new SlmError('SANDBOX_UNAVAILABLE', `Expected the QuickJS worker to start within ${STARTUP_TIMEOUT_MS / 1000} s but it did not.`)), STARTUP_TIMEOUT_MS);
      this.worker.once('message', (m: { t?: string; message?: string }) => {
        clearTimeout(timer);
        if (m?.t === 'ready') res();
        else rej(new SlmError('SANDBOX_UNAVAILABLE', `Expected the QuickJS worker to start but it failed: ${m?.message ?? JSON.stringify(m)}`));
      });
      this.worker.once('error', (e) => {
        clearTimeout(timer);
        rej(new SlmError('SANDBOX_UNAVAILABLE', `Expected the QuickJS worker to start but it failed: ${e.message}`));
      });
    });
    this.ready.catch(() => {});
    this.worker.on('message', (m: CallMsg | DoneMsg | { t: string }) => this.onMessage(m));
    this.worker.on('error', () => {}); // reported through 'exit'
    this.worker.once('exit', (code) => {
      this.dead = true;
      this.replyPort.close();
      const job = this.current;
      this.current = undefined;
      if (job) {
        clearTimeout(job.timer);
        job.resolve(this.result(job, { stdout: '', truncated: false, timedOut: false, error: `SandboxError: the QuickJS worker stopped (exit code ${code}) while running the program; it was replaced` }));
      }
      this.owner.workerGone(this);
    });
  }

  start(job: Job): void {
    const id = this.nextId++;
    const timer = setTimeout(() => {
      // Stuck where the interrupt handler cannot act (a long native builtin): end the thread.
      const cur = this.current;
      if (!cur || cur.id !== id) return;
      this.current = undefined;
      cur.resolve(this.result(cur, { stdout: '', truncated: false, timedOut: true, error: `TimeoutError: the program exceeded the time limit of ${job.limits.timeoutMs / 1000} s (its interpreter was stopped)` }));
      void this.worker.terminate();
    }, job.limits.timeoutMs + GRACE_MS);
    this.current = { ...job, id, calls: [], t0: performance.now(), timer };
    this.worker.postMessage({
      t: 'run',
      id,
      code: job.code,
      timeoutMs: job.limits.timeoutMs,
      memoryMb: job.limits.memoryMb,
      maxOutputChars: job.limits.maxOutputChars,
      stackKb: this.owner.stackKb,
      ...(job.globals ? { globals: job.globals } : {}),
      ...(job.finalAnswer ? { finalAnswer: true } : {}),
    } satisfies JobMsg);
  }

  private onMessage(m: CallMsg | DoneMsg | { t: string }): void {
    const cur = this.current;
    if (m.t === 'call') {
      const call = m as CallMsg;
      if (!cur || cur.id !== call.id) return;
      void Promise.resolve(invokeTool(cur.tools, call.name, call.args, cur.calls, cur.limits.maxCalls, this.owner.extraTools)).then((reply) => {
        if (this.dead) return;
        this.replyPort.postMessage({ seq: call.seq, ...reply });
        Atomics.store(this.flag, 0, 1);
        Atomics.notify(this.flag, 0);
      });
    } else if (m.t === 'done') {
      const done = m as DoneMsg;
      if (!cur || cur.id !== done.id) return;
      clearTimeout(cur.timer);
      this.current = undefined;
      const error = done.hostFailure ? `SandboxError: the interpreter failed (${done.hostFailure.slice(0, 300)}); it was replaced` : done.error;
      cur.resolve(this.result(cur, { stdout: done.stdout, truncated: done.truncated, timedOut: done.timedOut, error, ...(cur.finalAnswer && typeof done.finalAnswer === 'string' && !done.hostFailure ? { finalAnswer: done.finalAnswer } : {}) }));
      if (done.hostFailure) void this.worker.terminate();
      else this.owner.workerIdle(this);
    }
  }

  private result(job: Job & { calls: ToolCall[]; t0: number }, r: { stdout: string; truncated: boolean; timedOut: boolean; error: string | null; finalAnswer?: string }): SandboxResult {
    return {
      ...(r.finalAnswer !== undefined ? { final_answer: r.finalAnswer } : {}),
      stdout: r.truncated ? r.stdout + truncationMarker(job.limits.maxOutputChars) : r.stdout,
      error: r.error,
      timed_out: r.timedOut,
      calls: job.calls,
      truncated: r.truncated,
      duration_ms: performance.now() - job.t0,
    };
  }
}

let quickjsPathCache: string | undefined;
function quickjsPath(): string {
  return (quickjsPathCache ??= createRequire(import.meta.url).resolve('quickjs-emscripten'));
}

export class QuickJSSandbox implements Sandbox {
  readonly kind = 'quickjs' as const;
  readonly stackKb: number;
  readonly size: number;
  private workers = new Set<QjsWorker>();
  private idle: QjsWorker[] = [];
  private queue: Job[] = [];
  private closed = false;
  programs = 0;
  /** Worker threads started over the sandbox's life (replacements included). */
  started = 0;

  /** options.extraTools, checked, and their names (defined as globals in every interpreter). */
  readonly extraTools: ExtraTools | undefined;
  readonly extraToolNames: string[];

  constructor(readonly options: QuickJSSandboxOptions) {
    this.extraTools = options.extraTools ? checkTools(options.extraTools, 'extraTools', 'extraTools') : undefined;
    this.extraToolNames = Object.keys(this.extraTools ?? {});
    this.stackKb = options.stackKb ?? DEFAULT_STACK_KB;
    this.size = options.size ?? 1;
  }

  async start(): Promise<void> {
    const ws: QjsWorker[] = [];
    for (let i = 0; i < this.size; i++) ws.push(this.spawn());
    try {
      await Promise.all(ws.map((w) => w.ready));
    } catch (e) {
      await this.close();
      throw e;
    }
  }

  run(code: string, opts: RunOptions = {}): Promise<SandboxResult> {
    if (this.closed) return Promise.reject(new SlmError('SANDBOX_ERROR', 'Expected an open QuickJS sandbox but this one is closed; create a new one.'));
    if (typeof code !== 'string') return Promise.reject(new SlmError('ARGUMENT_INVALID', `Expected the program as a string but received ${typeof code}.`));
    let limits: Required<SandboxLimits>;
    let globals: Record<string, unknown> | undefined;
    try {
      limits = resolveLimits({ memoryMb: QUICKJS_DEFAULT_MEMORY_MB, ...defined(this.options), ...defined(opts) });
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
      const w = this.idle.shift()!;
      if (w.dead) continue;
      this.programs++;
      w.start(this.queue.shift()!);
    }
  }

  private spawn(): QjsWorker {
    const w = new QjsWorker(this);
    this.workers.add(w);
    this.started++;
    w.ready.then(
      () => this.workerIdle(w),
      () => {},
    );
    return w;
  }

  /** @internal */
  workerIdle(w: QjsWorker): void {
    if (this.closed || w.dead) return;
    this.idle.push(w);
    this.dispatch();
  }

  /** @internal A worker thread ended (terminated after a timeout, failed, or closed): replace it. */
  workerGone(w: QjsWorker): void {
    this.workers.delete(w);
    this.idle = this.idle.filter((x) => x !== w);
    if (!this.closed) this.spawn();
  }

  /** Stops every worker thread; queued programs are rejected, a running one gets an error result. */
  async close(): Promise<void> {
    this.closed = true;
    const err = new SlmError('SANDBOX_ERROR', 'The QuickJS sandbox was closed before this program could run.');
    for (const job of this.queue.splice(0)) job.reject(err);
    const all = [...this.workers];
    await Promise.all(all.map((w) => w.worker.terminate().then(() => w.exited)));
  }
}

function defined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** A QuickJS sandbox: starts its worker threads and waits until they are ready. */
export async function createQuickJSSandbox(opts: QuickJSSandboxOptions = {}): Promise<QuickJSSandbox> {
  resolveLimits({ memoryMb: QUICKJS_DEFAULT_MEMORY_MB, ...defined(opts) });
  if (opts.stackKb !== undefined && !(Number.isInteger(opts.stackKb) && opts.stackKb >= 16 && opts.stackKb <= MAX_STACK_KB)) {
    throw new SlmError('ARGUMENT_INVALID', `Expected stackKb to be an integer from 16 to ${MAX_STACK_KB} but received ${String(opts.stackKb)}.`);
  }
  if (opts.size !== undefined && !(Number.isInteger(opts.size) && opts.size >= 1)) {
    throw new SlmError('ARGUMENT_INVALID', `Expected size to be a positive integer but received ${String(opts.size)}.`);
  }
  const sb = new QuickJSSandbox(opts);
  await sb.start();
  return sb;
}
