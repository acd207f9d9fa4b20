/**
 * The OpenAI server's batching queue: continuous batching. Rows run in decode sessions
 * (Model.decodeSession, lib/engine/session.ts): a row that agrees with a running session on the
 * per-session settings (top-k, stops, whether log-probs are wanted, the adapter) joins it at once —
 * its prompt is prefilled prefillChunk positions at a time (default 512) between the running rows'
 * decode steps, and it decodes with them from the next step on; a session ends when its last row
 * does. Rows with other settings start a session of their own beside it, up to maxConcurrentCalls
 * sessions at once (default 2, each on its own worker thread over the same weights); a session with
 * another adapter waits until none runs (the adapter is switched only then). A row whose client left
 * is dropped from the queue, or cancelled in its session (between two prefill chunks, or before its
 * next token).
 */
import type { DecodeSession, RowFinish, SessionStats } from '../engine/session.js';
import type { TokenEvent } from '../engine/types.js';
import { History } from './history.js';
import type { Job } from './job.js';
import type { ServeOptions } from './options.js';

/**
 * The rows submitted together (one request's choices, or the requests queued at that moment), once
 * the last of them has ended: the old "generate call".
 */
export interface CallRecord {
  rows: number;
  /** Decode steps its longest row took (its tokens). */
  steps: number;
  finish: string[];
  /** Prompt tokens of its rows that were prefilled whole (a row that left during its prefill: 0). */
  prefillTokens: number;
}

/** Top log-probs a session computes when any of its rows asks for them (the OpenAI API's most). */
const SESSION_TOP_N = 20;

interface Running {
  key: string;
  adapter: string | null;
  session: DecodeSession;
}

export class Batcher {
  private queue: Job[] = [];
  private sessions: Running[] = [];
  /** An adapter switch (or its wait) in progress: nothing starts meanwhile. */
  private switching = false;
  /** Rows submitted together: each submission's row count (tests and logs). */
  readonly batches = new History<number>();
  /** Each submission's record, once its last row has ended (tests and logs). */
  readonly calls = new History<CallRecord>();
  /** Each decode session's counters when it ends: rows, rows that joined it running, steps, prefill. */
  readonly sessionStats = new History<SessionStats>();
  /** The adapter on the model now (null: the one it was started with, or none). */
  private active: string | null = null;
  /** Resolves the promises idle() gave out, when the queue is empty and no session runs. */
  private waiting: Array<() => void> = [];

  constructor(
    private readonly o: ServeOptions,
    /** The adapters loaded at run time (the server's): name -> PEFT folder. */
    private readonly adapters: ReadonlyMap<string, string>,
  ) {}

  /** Queues a request's rows (a cancelled row leaves the queue) and submits what can run. */
  enqueue(jobs: Job[]): void {
    for (const j of jobs) {
      j.abort.signal.addEventListener(
        'abort',
        () => {
          this.queue = this.queue.filter((x) => x !== j);
          j.end('cancelled');
        },
        { once: true },
      );
    }
    this.queue.push(...jobs.filter((j) => !j.ended));
    this.pump();
  }

  /** Puts the job's adapter on the model (the started adapter, or none, for null). */
  private async useAdapter(name: string | null): Promise<void> {
    if (name === this.active && (name === null || this.adapters.has(name))) return;
    const dir = name === null ? this.o.adapter : this.adapters.get(name);
    if (dir) await this.o.model.loadAdapter(dir);
    else this.o.model.detachLora();
    this.active = name;
  }

  /** The settings a session shares: rows join only a session that agrees on them. */
  private static key(j: Job): string {
    return JSON.stringify([j.s.topK, [...j.s.stop].sort(), j.s.stopTokenIds, j.s.topN > 0, j.s.adapter]);
  }

  /** Submits every queued row that can run now: to a running session that agrees, or a new one. */
  private pump(): void {
    if (this.switching) return;
    const groups = new Map<string, Job[]>();
    for (const j of this.queue) {
      if (j.ended) continue;
      const k = Batcher.key(j);
      const g = groups.get(k);
      if (g) g.push(j);
      else groups.set(k, [j]);
    }
    for (const [key, jobs] of groups) {
      let run = this.sessions.find((s) => s.key === key);
      if (!run) {
        const adapter = jobs[0].s.adapter;
        if (this.sessions.length >= (this.o.maxConcurrentCalls ?? 2)) continue;
        if (adapter !== this.active || (adapter !== null && !this.adapters.has(adapter))) {
          if (this.sessions.length) continue; // the adapter is switched only when no session runs
          this.switchTo(adapter, jobs);
          return;
        }
        run = this.start(key, jobs[0]);
      }
      if (!this.submit(run, jobs)) {
        // It ended between its last row's end and now: a new session takes the rows.
        this.sessions = this.sessions.filter((s) => s !== run);
        this.submit(this.start(key, jobs[0]), jobs);
      }
    }
    this.settle();
  }

  private switchTo(adapter: string | null, jobs: Job[]): void {
    this.switching = true;
    this.useAdapter(adapter)
      .catch((e: Error) => {
        for (const j of jobs) j.fail(e);
        this.queue = this.queue.filter((j) => !jobs.includes(j));
      })
      .finally(() => {
        this.switching = false;
        this.pump();
      });
  }

  /** A new decode session for rows like `first`; removed from the running ones when it ends. */
  private start(key: string, first: Job): Running {
    const session = this.o.model.decodeSession({
      topK: first.s.topK,
      stopTokenIds: first.s.stopTokenIds,
      stopStrings: first.s.stop,
      topLogprobs: first.s.topN > 0 ? SESSION_TOP_N : 0,
      prefillChunk: this.o.prefillChunk ?? 512,
      maxRows: this.o.maxBatch ?? 32,
    });
    const run: Running = { key, adapter: first.s.adapter, session };
    this.sessions.push(run);
    session.done
      .then(
        (stats) => this.sessionStats.push(stats),
        () => {}, // its rows got the error
      )
      .finally(() => {
        this.sessions = this.sessions.filter((s) => s !== run);
        this.pump();
      });
    return run;
  }

  /** Submits `jobs` to the session together, as one record; false when it has ended (none submitted). */
  private submit(run: Running, jobs: Job[]): boolean {
    const record: CallRecord = { rows: 0, steps: 0, finish: [], prefillTokens: 0 };
    let open = 0;
    const ended = (j: Job, f: RowFinish, tokens: number) => {
      record.finish[jobs.indexOf(j)] = f;
      record.steps = Math.max(record.steps, tokens);
      if (tokens > 0) record.prefillTokens += j.prompt.length;
      if (--open === 0) this.calls.push(record);
    };
    const ids = run.session.submitAll(
      jobs.map((j) => {
        let tokens = 0;
        return {
          prompt: j.prompt,
          maxNewTokens: j.s.maxTokens,
          temperature: j.s.temperature,
          topP: j.s.topP,
          // Each row's own seed: its samples do not depend on what it is batched with.
          seed: j.seed,
          signal: j.abort.signal,
          onToken: (ev: TokenEvent) => {
            tokens++;
            // Only the top-n the row asked for (the session computes the most any row may ask).
            j.token(
              ev.top && j.s.topN < ev.top.ids.length
                ? { ...ev, top: { ids: ev.top.ids.subarray(0, j.s.topN), logprobs: ev.top.logprobs.subarray(0, j.s.topN) } }
                : ev,
            );
          },
          onEnd: (f: RowFinish, error?: unknown) => {
            if (error !== undefined) j.fail(error as Error);
            else j.end(f);
            ended(j, f, tokens);
          },
        };
      }),
    );
    if (!ids.length) return false;
    open = record.rows = jobs.length;
    this.queue = this.queue.filter((j) => !jobs.includes(j));
    this.batches.push(record.rows);
    return true;
  }

  /** Resolves the idle() promises when no row is queued and no session runs. */
  private settle(): void {
    if (!this.sessions.length && !this.switching && !this.queue.length) for (const w of this.waiting.splice(0)) w();
  }

  /** Resolves when no row is queued and no decode session runs (now, or once the running ones end). */
  idle(): Promise<void> {
    if (!this.sessions.length && !this.switching && !this.queue.length) return Promise.resolve();
    return new Promise((r) => this.waiting.push(r));
  }
}
