/**
 * The OpenAI server's batching queue: a call takes every queued row that agrees with the first one
 * on the per-call settings (top-k, stops, adapter), up to maxBatch, putting that adapter on the model
 * first. Up to maxConcurrentCalls calls run at once (default 2, each on its own worker thread over
 * the same weights): rows that arrive while a call runs wait for it to end, or at most
 * concurrentAfterMs (default 200) before they start a call of their own beside it, so requests that
 * arrive close together still share a call and a short request is not stuck behind a long one; a
 * call with another adapter waits until the running calls end (the adapter is switched only when
 * none runs). Prompts are prefilled prefillChunk positions at a time (default
 * 512), and a call whose every row was cancelled (its clients left) stops between two chunks.
 */
import { History } from './history.js';
import type { Job } from './job.js';
import type { ServeOptions } from './options.js';

/** A finished generate call of the server. */
export interface CallRecord {
  rows: number;
  steps: number;
  finish: string[];
  /** Prompt tokens the prefill computed (fewer than the prompts' when every row left during it). */
  prefillTokens: number;
}

export class Batcher {
  private queue: Job[] = [];
  /** Generate calls running now, and whether pump() is choosing the next one. */
  private running = 0;
  private starting = false;
  /** When each queued row was queued (the concurrent-call delay counts from it). */
  private queuedAt = new WeakMap<Job, number>();
  private timer: NodeJS.Timeout | null = null;
  /** Generate calls made and rows per call (tests and logs): the recent ones and their count. */
  readonly batches = new History<number>();
  /** Each finished generate call: its rows, decode steps and how each row ended (tests and logs). */
  readonly calls = new History<CallRecord>();
  /** The adapter on the model now (null: the one it was started with, or none). */
  private active: string | null = null;
  /** Resolves the promises idle() gave out, when the queue is empty and no call runs. */
  private waiting: Array<() => void> = [];

  constructor(
    private readonly o: ServeOptions,
    /** The adapters loaded at run time (the server's): name -> PEFT folder. */
    private readonly adapters: ReadonlyMap<string, string>,
  ) {}

  /** Queues a request's rows (a cancelled row leaves the queue) and starts a call if none runs. */
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
    const now = performance.now();
    for (const j of jobs) this.queuedAt.set(j, now);
    this.queue.push(...jobs.filter((j) => !j.ended));
    void this.pump();
  }

  /** Puts the job's adapter on the model (the started adapter, or none, for null). */
  private async useAdapter(name: string | null): Promise<void> {
    if (name === this.active && (name === null || this.adapters.has(name))) return;
    const dir = name === null ? this.o.adapter : this.adapters.get(name);
    if (dir) await this.o.model.loadAdapter(dir);
    else this.o.model.detachLora();
    this.active = name;
  }

  /** Starts batched generate calls for the queued rows, up to maxConcurrentCalls at once. */
  private async pump(): Promise<void> {
    if (this.starting) return;
    this.starting = true;
    try {
      while (this.queue.length && this.running < (this.o.maxConcurrentCalls ?? 2)) {
        // Give requests that arrive together a chance to share the call.
        await new Promise((r) => setImmediate(r));
        // While calls run, only rows with the adapter on the model can start (it is switched when none
        // runs), and only once they have waited concurrentAfterMs for the running call to end.
        const first = this.running ? this.queue.find((j) => j.s.adapter === this.active) : this.queue[0];
        if (!first) break;
        if (this.running) {
          const wait = (this.queuedAt.get(first) ?? 0) + (this.o.concurrentAfterMs ?? 200) - performance.now();
          if (wait > 0) {
            this.timer ??= setTimeout(() => {
              this.timer = null;
              void this.pump();
            }, wait).unref();
            break;
          }
        }
        // The engine applies top-k / stops / the adapter per call: batch only rows that agree (top-p is per row).
        const key = (j: Job) => JSON.stringify([j.s.topK, [...j.s.stop].sort(), j.s.stopTokenIds, j.s.adapter]);
        const firstKey = key(first);
        const take = this.batchOf(first, (j) => key(j) === firstKey);
        this.queue = this.queue.filter((j) => !take.includes(j));
        if (!this.running) {
          try {
            await this.useAdapter(first.s.adapter);
          } catch (e) {
            for (const j of take) j.fail(e as Error);
            continue;
          }
        }
        // A row cancelled while the call was being set up (its client left) is not prefilled.
        const live = take.filter((j) => !j.ended);
        if (!live.length) continue;
        this.running++;
        void this.run(live).finally(() => {
          this.running--;
          this.settle();
          void this.pump();
        });
      }
    } finally {
      this.starting = false;
      this.settle();
    }
  }

  /**
   * The queued rows of one call: `first`, then those that `agrees` admits, in queue order, up to
   * maxBatch, each only while at least half of the padded prefill stays real tokens (a call pads
   * every prompt to its longest: a 2,000-token prompt with 31 thirty-token ones would prefill 64,000
   * positions for 2,900 tokens; the short ones go in a call of their own instead).
   */
  private batchOf(first: Job, agrees: (j: Job) => boolean): Job[] {
    const take = [first];
    let sum = first.prompt.length;
    let longest = first.prompt.length;
    for (const j of this.queue) {
      if (take.length >= (this.o.maxBatch ?? 32)) break;
      if (j === first || !agrees(j)) continue;
      const n = j.prompt.length;
      const padded = Math.max(longest, n) * (take.length + 1);
      if (padded > 2 * (sum + n)) continue;
      take.push(j);
      sum += n;
      longest = Math.max(longest, n);
    }
    return take;
  }

  /** Resolves the idle() promises when no row is queued and no call runs or is being started. */
  private settle(): void {
    if (!this.running && !this.starting && !this.queue.length) for (const w of this.waiting.splice(0)) w();
  }

  /** Resolves when no row is queued and no generate call runs (now, or once the running calls end). */
  idle(): Promise<void> {
    if (!this.running && !this.starting && !this.queue.length) return Promise.resolve();
    return new Promise((r) => this.waiting.push(r));
  }

  /** One batched generate call of `take` (rows that agree on the per-call settings). */
  private async run(take: Job[]): Promise<void> {
    const first = take[0];
    this.batches.push(take.length);
    try {
      const r = await this.o.model.generateStream({
        prompts: take.map((j) => j.prompt),
        maxNewTokens: Math.max(...take.map((j) => j.s.maxTokens)),
        rowMaxNewTokens: take.map((j) => j.s.maxTokens),
        temperature: take.map((j) => j.s.temperature),
        topP: take.map((j) => j.s.topP),
        topK: first.s.topK,
        // Each row's own seed: its samples do not depend on what it was batched with.
        rowSeeds: take.map((j) => j.seed),
        stopTokenIds: first.s.stopTokenIds,
        stopStrings: first.s.stop,
        topLogprobs: Math.max(...take.map((j) => j.s.topN)),
        signals: take.map((j) => j.abort.signal),
        prefillChunk: this.o.prefillChunk ?? 512,
        onToken: (ev) => {
          const j = take[ev.row];
          try {
            j.token(ev);
          } catch (e) {
            // This row alone fails (its request gets the error); the others go on.
            j.fail(e as Error);
            j.abort.abort();
          }
        },
      });
      this.calls.push({ rows: take.length, steps: r.steps, finish: r.finishReasons, prefillTokens: r.prefillTokens });
      take.forEach((j, i) => j.end(r.finishReasons[i]));
    } catch (e) {
      for (const j of take) j.fail(e as Error);
    }
  }
}
