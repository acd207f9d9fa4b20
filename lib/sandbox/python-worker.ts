/**
 * One Python sandbox worker, seen from the host: python/sandbox_runner.py started under the isolation
 * wrapper, the program it is running (with its backstop timer and tool calls), its death and its kill.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SlmError } from '../errors.js';
import { BWRAP_WORKDIR, type RunnerCaps, WORKER_ENV, wrapperCommand } from './isolation.js';
import { programResult, type Job } from './job.js';
import { decodeFrame, encodeFrame, FrameDecoder, type Msg } from './python-wire.js';
import { invokeTool, type ExtraTools } from './tools.js';
import type { IsolationLevel, IsolationReport, ToolCall } from './types.js';

const BACKSTOP_MS = 2000;
const STARTUP_TIMEOUT_MS = 20_000;

/** What a worker needs from its pool (PythonSandboxPool). */
export interface WorkerPool {
  readonly options: { uid?: number; workdirMb?: number };
  readonly isolation: IsolationReport;
  readonly tag: string;
  readonly extraTools: ExtraTools | undefined;
  readonly extraToolNames: string[];
  workerIdle(w: Worker): void;
  workerGone(w: Worker): void;
  /** Runs a program again on another worker (false: the pool is closed, the program was not queued). */
  retry(job: Job): boolean;
}

interface Running extends Job {
  id: number;
  calls: ToolCall[];
  t0: number;
  backstop: NodeJS.Timeout;
  /** The worker acknowledged the program (its `started` frame): from then on it may have run. */
  started: boolean;
}

let nextWorkerSerial = 0;

/** One worker process; its pool starts it, hands it programs and replaces it when it dies. */
export class Worker {
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
    private pool: WorkerPool,
    level: IsolationLevel,
    caps: RunnerCaps,
  ) {
    const opts = pool.options;
    let workdir = BWRAP_WORKDIR;
    if (level !== 'bwrap') workdir = this.hostDir = mkdtempSync(join(tmpdir(), 'slm-sandbox-'));
    const config = JSON.stringify({ workdir, uid: opts.uid ?? 65534, gid: opts.uid ?? 65534, require_seccomp: pool.isolation.seccomp });
    const { file, args } = wrapperCommand(
      level,
      pool.isolation.python,
      caps,
      ['--config', config, '--tag', pool.tag],
      opts.workdirMb ?? 64,
    );
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
      readyReject(
        new SlmError(
          'SANDBOX_UNAVAILABLE',
          `Expected a sandbox worker to start within ${STARTUP_TIMEOUT_MS / 1000} s but it did not. ${this.diagnostics()}`,
        ),
      );
      this.kill();
    }, STARTUP_TIMEOUT_MS);
    const decoder = new FrameDecoder((payload) => {
      let msg: Msg;
      try {
        msg = decodeFrame(payload);
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
      if (wasStarting)
        readyReject(
          new SlmError(
            'SANDBOX_UNAVAILABLE',
            `Expected a sandbox worker to start but it exited (${signal ?? 'code ' + code}). ${this.diagnostics()}`,
          ),
        );
      if (this.hostDir) rmSync(this.hostDir, { recursive: true, force: true });
      const running = this.current;
      this.current = undefined;
      if (running) {
        clearTimeout(running.backstop);
        // A worker that died before it acknowledged the program (killed or crashed while idle, its
        // exit not yet seen when the program was handed to it) never ran it: it runs on another
        // worker, once (a program whose delivery itself kills workers gets the error the next time).
        const { id: _id, calls: _calls, t0: _t0, backstop: _b, started, ...job } = running;
        if (started || job.retried || !this.pool.retry({ ...job, retried: true }))
          running.resolve(
            programResult(running, {
              error: `SandboxError: the sandbox worker died (${signal ?? 'exit code ' + code}) while running the program; it was replaced`,
              stdout: '',
              timedOut: false,
              truncated: false,
            }),
          );
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
      running.resolve(
        programResult(running, {
          stdout: '',
          truncated: false,
          timedOut: true,
          error: `TimeoutError: the program exceeded the time limit of ${job.limits.timeoutMs / 1000} s (the worker did not answer and was replaced)`,
        }),
      );
      this.kill();
    }, job.limits.timeoutMs + BACKSTOP_MS);
    this.current = { ...job, id, calls: [], t0: performance.now(), backstop, started: false };
    this.state = 'busy';
    this.send({
      t: 'run',
      id,
      code: job.code,
      timeout_ms: job.limits.timeoutMs,
      cpu_s: job.limits.cpuSeconds,
      memory_mb: job.limits.memoryMb,
      max_output: job.limits.maxOutputChars,
      ack: true, // the worker confirms it has the program (a `started` frame) before its child gets it
      ...(job.globals ? { globals: job.globals } : {}),
      ...(job.finalAnswer ? { final_answer: true } : {}),
      ...(this.pool.extraToolNames.length ? { extra_tools: this.pool.extraToolNames } : {}),
    });
  }

  private onMessage(msg: Msg): void {
    const running = this.current;
    if (msg.t === 'started') {
      if (running && msg.id === running.id) running.started = true;
    } else if (msg.t === 'call') {
      if (!running) {
        this.fail('a tool call arrived while no program was running');
        return;
      }
      const { id } = running;
      void Promise.resolve(
        invokeTool(running.tools, msg.name, msg.args, running.calls, running.limits.maxCalls, this.pool.extraTools),
      ).then((reply) => {
        if (this.current?.id !== id) return; // the program already ended
        this.send({ t: 'ret', id, seq: msg.seq, ...reply });
      });
    } else if (msg.t === 'done') {
      if (!running || msg.id !== running.id) return; // a late answer for a program the backstop already ended
      clearTimeout(running.backstop);
      this.current = undefined;
      this.state = 'idle';
      running.resolve(
        programResult(running, {
          stdout: typeof msg.stdout === 'string' ? msg.stdout : '',
          truncated: msg.truncated === true,
          timedOut: msg.timed_out === true,
          error: typeof msg.error === 'string' ? msg.error : null,
          ...(running.finalAnswer && typeof msg.final_answer === 'string' ? { finalAnswer: msg.final_answer } : {}),
        }),
      );
      this.pool.workerIdle(this);
    } else this.fail(`unexpected frame ${JSON.stringify(msg.t)} from the worker`);
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
