/**
 * The code of a QuickJS worker thread: a fresh QuickJS runtime and context per program, the tools
 * installed as synchronous globals (each call blocks in `Atomics.wait` until the host answers),
 * console/print captured and capped, the deadline polled by the interrupt handler. It is sent to
 * the thread as source text (WORKER_SOURCE); the messages it exchanges with the host are below.
 */
import type { MessagePort } from 'node:worker_threads';

export interface JobMsg {
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
export interface DoneMsg {
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
export interface CallMsg {
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
        if (again?.message && again.message.seq === my) return again.message;
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
    const toHandle = (value: unknown): import('quickjs-emscripten').QuickJSHandle => {
      if (value === null || value === undefined) return vm.null;
      if (typeof value === 'string') return vm.newString(value);
      if (typeof value === 'number') return vm.newNumber(value);
      if (typeof value === 'boolean') return value ? vm.true : vm.false;
      const container = Array.isArray(value) ? vm.newArray() : vm.newObject();
      const entries: [string | number, unknown][] = Array.isArray(value) ? value.map((x, i) => [i, x]) : Object.entries(value as object);
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
          const reply = callHost(
            name,
            handles.map((h) => vm.dump(h)),
          );
          if (reply.ok) return toHandle(reply.value);
          return { error: vm.newError({ name: reply.etype === 'TypeError' ? 'TypeError' : 'Error', message: String(reply.error) }) };
        });
        vm.setProp(vm.global, name, fn);
        fn.dispose();
      }
      if (job.finalAnswer) {
        // final_answer(x) records x as text and throws to end the program (a program that catches it
        // still ends with that answer: the first call counts).
        const fn = vm.newFunction('final_answer', (handle) => {
          if (finalText === null) {
            const v = handle === undefined ? undefined : vm.dump(handle);
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
export const PRELUDE = `(() => {
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

/** The worker thread's program (run with `eval: true`): workerMain, with a start-up failure reported as a 'fatal' message. */
export const WORKER_SOURCE = `(${workerMain.toString()})().catch((e) => { require('node:worker_threads').parentPort.postMessage({ t: 'fatal', message: String(e && e.stack || e) }); });`;
