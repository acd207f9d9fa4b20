/**
 * One QuickJS worker thread, seen from the host: starting it, handing it a program, answering its
 * tool calls, and its end (a program past its deadline, a failure inside it) after which the
 * sandbox replaces it.
 */
import { createRequire } from 'node:module';
import { MessageChannel, type MessagePort, Worker } from 'node:worker_threads';
import { SlmError } from '../errors.js';
import { programResult, type Job } from './job.js';
import { type CallMsg, type DoneMsg, type JobMsg, PRELUDE, WORKER_SOURCE } from './quickjs-interpreter.js';
import { invokeTool, type ExtraTools } from './tools.js';
import type { ToolCall } from './types.js';
import { TOOL_NAMES } from './types.js';

/** After the deadline, how long a worker may take to notice it before the host terminates it. */
const GRACE_MS = 1000;
const STARTUP_TIMEOUT_MS = 20_000;

/** What a worker thread needs from its sandbox (QuickJSSandbox). */
export interface WorkerOwner {
  readonly stackKb: number;
  readonly extraTools: ExtraTools | undefined;
  readonly extraToolNames: string[];
  workerIdle(w: QjsWorker): void;
  workerGone(w: QjsWorker): void;
}

/** One worker thread and the program it is running; its sandbox hands it programs and replaces it when it ends. */
export class QjsWorker {
  readonly worker: Worker;
  readonly ready: Promise<void>;
  readonly exited: Promise<void>;
  private replyPort: MessagePort;
  private flag = new Int32Array(new SharedArrayBuffer(4));
  current?: Job & { id: number; calls: ToolCall[]; t0: number; timer: NodeJS.Timeout };
  dead = false;
  private nextId = 1;

  constructor(private owner: WorkerOwner) {
    const { port1, port2 } = new MessageChannel();
    this.replyPort = port1;
    this.worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: {
        quickjsPath: quickjsPath(),
        replyPort: port2,
        flag: this.flag.buffer,
        toolNames: [...TOOL_NAMES, ...owner.extraToolNames],
        prelude: PRELUDE,
      },
      transferList: [port2],
      resourceLimits: { maxOldGenerationSizeMb: 256, stackSizeMb: 8 },
      stdout: true,
      stderr: true,
    });
    this.worker.stdout.resume();
    this.worker.stderr.resume();
    this.exited = new Promise((res) => this.worker.once('exit', () => res()));
    this.ready = new Promise((res, rej) => {
      const timer = setTimeout(
        () =>
          rej(
            new SlmError(
              'SANDBOX_UNAVAILABLE',
              `Expected the QuickJS worker to start within ${STARTUP_TIMEOUT_MS / 1000} s but it did not.`,
            ),
          ),
        STARTUP_TIMEOUT_MS,
      );
      this.worker.once('message', (m: { t?: string; message?: string }) => {
        clearTimeout(timer);
        if (m?.t === 'ready') res();
        else
          rej(
            new SlmError('SANDBOX_UNAVAILABLE', `Expected the QuickJS worker to start but it failed: ${m?.message ?? JSON.stringify(m)}`),
          );
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
        job.resolve(
          programResult(job, {
            stdout: '',
            truncated: false,
            timedOut: false,
            error: `SandboxError: the QuickJS worker stopped (exit code ${code}) while running the program; it was replaced`,
          }),
        );
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
      cur.resolve(
        programResult(cur, {
          stdout: '',
          truncated: false,
          timedOut: true,
          error: `TimeoutError: the program exceeded the time limit of ${job.limits.timeoutMs / 1000} s (its interpreter was stopped)`,
        }),
      );
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

  private onMessage(msg: CallMsg | DoneMsg | { t: string }): void {
    const cur = this.current;
    if (msg.t === 'call') {
      const call = msg as CallMsg;
      if (!cur || cur.id !== call.id) return;
      void Promise.resolve(invokeTool(cur.tools, call.name, call.args, cur.calls, cur.limits.maxCalls, this.owner.extraTools)).then(
        (reply) => {
          if (this.dead) return;
          this.replyPort.postMessage({ seq: call.seq, ...reply });
          Atomics.store(this.flag, 0, 1);
          Atomics.notify(this.flag, 0);
        },
      );
    } else if (msg.t === 'done') {
      const done = msg as DoneMsg;
      if (!cur || cur.id !== done.id) return;
      clearTimeout(cur.timer);
      this.current = undefined;
      const error = done.hostFailure
        ? `SandboxError: the interpreter failed (${done.hostFailure.slice(0, 300)}); it was replaced`
        : done.error;
      cur.resolve(
        programResult(cur, {
          stdout: done.stdout,
          truncated: done.truncated,
          timedOut: done.timedOut,
          error,
          ...(cur.finalAnswer && typeof done.finalAnswer === 'string' && !done.hostFailure ? { finalAnswer: done.finalAnswer } : {}),
        }),
      );
      if (done.hostFailure) void this.worker.terminate();
      else this.owner.workerIdle(this);
    }
  }
}

let quickjsPathCache: string | undefined;
function quickjsPath(): string {
  return (quickjsPathCache ??= createRequire(import.meta.url).resolve('quickjs-emscripten'));
}
