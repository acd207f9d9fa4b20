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
 *
 * The thread's code is lib/sandbox/quickjs-interpreter.ts, the host's handle on one thread
 * lib/sandbox/quickjs-worker.ts; this file holds the sandbox that queues programs onto them.
 */
import { SlmError } from '../errors.js';
import { stripUndefined } from '../util/objects.js';
import { type Job, resolveLimits } from './job.js';
import { QjsWorker, type WorkerOwner } from './quickjs-worker.js';
import { checkGlobals, type ExtraTools } from './tools.js';
import { checkTools } from '../extensions.js';
import type { RunOptions, Sandbox, SandboxLimits, SandboxResult, SearchTools } from './types.js';

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

export class QuickJSSandbox implements Sandbox, WorkerOwner {
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
    if (this.closed)
      return Promise.reject(new SlmError('SANDBOX_ERROR', 'Expected an open QuickJS sandbox but this one is closed; create a new one.'));
    if (typeof code !== 'string')
      return Promise.reject(new SlmError('ARGUMENT_INVALID', `Expected the program as a string but received ${typeof code}.`));
    let limits: Required<SandboxLimits>;
    let globals: Record<string, unknown> | undefined;
    try {
      limits = resolveLimits({ memoryMb: QUICKJS_DEFAULT_MEMORY_MB, ...stripUndefined(this.options), ...stripUndefined(opts) });
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

/** A QuickJS sandbox: starts its worker threads and waits until they are ready. */
export async function createQuickJSSandbox(opts: QuickJSSandboxOptions = {}): Promise<QuickJSSandbox> {
  resolveLimits({ memoryMb: QUICKJS_DEFAULT_MEMORY_MB, ...stripUndefined(opts) });
  if (opts.stackKb !== undefined && !(Number.isInteger(opts.stackKb) && opts.stackKb >= 16 && opts.stackKb <= MAX_STACK_KB)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected stackKb to be an integer from 16 to ${MAX_STACK_KB} but received ${String(opts.stackKb)}.`,
    );
  }
  if (opts.size !== undefined && !(Number.isInteger(opts.size) && opts.size >= 1)) {
    throw new SlmError('ARGUMENT_INVALID', `Expected size to be a positive integer but received ${String(opts.size)}.`);
  }
  const sb = new QuickJSSandbox(opts);
  await sb.start();
  return sb;
}
