/**
 * Continuous batching from TypeScript (Model.decodeSession): one native decode loop
 * (native/core/continuous.h) that rows join while it runs — a row submitted during a decode is
 * prefilled a chunk at a time between the running rows' steps and decodes with them from the next
 * step on. Each row has its own prompt, token limit, temperature, top-p and random stream (its tokens
 * are those generate gives it alone); top-k, the stops and the top-n log-probs belong to the
 * session. What a server's batching queue (lib/serve/batcher.ts) drives.
 */
import type { NativeSessionOptions, NativeSessionRow, NativeSessionStats } from '../binding/session-types.js';
import type { NativeGenerateStep, NativeModel } from '../binding/types.js';
import { SlmError, describe } from '../errors.js';
import { FINISH } from './generate-call.js';
import type { TokenEvent } from './types.js';

export type RowFinish = (typeof FINISH)[number];

export interface SessionOptions {
  topK?: number;
  stopTokenIds?: number[];
  stopStrings?: string[];
  /** The n most likely tokens of every step with their log-probs (0: none). */
  topLogprobs?: number;
  /** Prompt positions per prefill forward while other rows decode (0: a prompt at once; default 256). */
  prefillChunk?: number;
  /** Rows decoding at once (default 32); later rows wait for one to end. */
  maxRows?: number;
}

export interface SessionRow {
  prompt: Int32Array;
  maxNewTokens: number;
  /** 0: greedy (default 1). */
  temperature?: number;
  topP?: number;
  /** The row's random stream (default 0). */
  seed?: number;
  /** Aborting it ends the row before its next token (finish 'cancelled'). */
  signal?: AbortSignal;
  /** Each token as it is sampled (`row` is the row's id in the session). A throw cancels the row and ends it with the error. */
  onToken?: (ev: TokenEvent) => void;
  /** Once, when the row has ended: how, or the error that ended it. */
  onEnd?: (finish: RowFinish, error?: unknown) => void;
}

export type SessionStats = NativeSessionStats;

interface Open {
  row: SessionRow;
  unlisten?: () => void;
}

export class DecodeSession {
  /**
   * Settles once the loop, started by the first submit, has ended and every row it took has ended
   * (rejects: the loop failed; its rows end with the error).
   */
  readonly done: Promise<SessionStats>;
  #call: ReturnType<NativeModel['decodeSession']> | null = null;
  #open = new Map<number, Open>();
  #drained: (() => void) | null = null;
  #settle!: { resolve: (s: SessionStats) => void; reject: (e: unknown) => void };
  #topN: number;
  #native: NativeSessionOptions;

  constructor(
    private readonly model: NativeModel,
    opts: SessionOptions,
    vocabSize: number,
  ) {
    const topN = opts.topLogprobs ?? 0;
    if (!Number.isInteger(topN) || topN < 0 || topN > vocabSize)
      throw new SlmError('ARGUMENT_INVALID', `topLogprobs must be an integer from 0 to the vocabulary size, found ${describe(topN)}.`);
    this.#topN = topN;
    for (const [k, v, min] of [
      ['maxRows', opts.maxRows ?? 32, 1],
      ['prefillChunk', opts.prefillChunk ?? 256, 0],
      ['topK', opts.topK ?? 0, 0],
    ] as const)
      if (!Number.isInteger(v) || v < min)
        throw new SlmError('ARGUMENT_INVALID', `decodeSession: ${k} must be an integer, at least ${min}, found ${describe(v)}.`);
    this.#native = {
      topK: opts.topK ?? 0,
      topN,
      stopTokenIds: Int32Array.from(opts.stopTokenIds ?? []),
      stopStrings: opts.stopStrings ?? [],
      prefillChunk: opts.prefillChunk ?? 256,
      maxRows: opts.maxRows ?? 32,
    };
    this.done = new Promise((resolve, reject) => (this.#settle = { resolve, reject }));
    this.done.catch(() => {}); // the rows got the error; a caller that awaits done sees it too
  }

  /** Rows submitted that have not ended. */
  get rows(): number {
    return this.#open.size;
  }

  /**
   * Adds a row: the first starts the loop, the next ones join it. The row's id, or -1 when the loop
   * has ended (start another session).
   */
  submit(row: SessionRow): number {
    return this.submitAll([row])[0] ?? -1;
  }

  /**
   * Adds rows together (a request's choices): all of them or none — their ids, or an empty array when
   * the loop has ended (start another session), so a request is never split between two sessions.
   */
  submitAll(rows: SessionRow[]): number[] {
    if (!rows.length) return [];
    const native: NativeSessionRow[] = rows.map((row) => ({
      ids: row.prompt,
      maxNewTokens: row.maxNewTokens,
      temperature: row.temperature ?? 1,
      topP: row.topP ?? 1,
      seed: row.seed ?? 0,
    }));
    let ids: number[];
    if (!this.#call) {
      this.#call = this.model.decodeSession(this.#native, (step) => this.#step(step), native);
      ids = rows.map((_, i) => i);
      this.#call.done.then(
        async (stats) => {
          // The last iterations' events may still be queued behind the result.
          if (this.#open.size) await new Promise<void>((res) => (this.#drained = res));
          this.#settle.resolve(stats);
        },
        (e) => {
          for (const [k, o] of [...this.#open]) this.#end(k, o, 'cancelled', e);
          this.#settle.reject(e);
        },
      );
    } else {
      ids = this.#call.submit(native);
      if (!ids.length) return ids;
    }
    const call = this.#call;
    rows.forEach((row, i) => {
      const id = ids[i];
      const o: Open = { row };
      this.#open.set(id, o);
      const sig = row.signal;
      if (!sig) return;
      const stop = () => call.cancel(id);
      if (sig.aborted) stop();
      else {
        sig.addEventListener('abort', stop, { once: true });
        o.unlisten = () => sig.removeEventListener('abort', stop);
      }
    });
    return ids;
  }

  #end(id: number, o: Open, finish: RowFinish, error?: unknown): void {
    this.#open.delete(id);
    o.unlisten?.();
    o.row.onEnd?.(finish, error);
    if (!this.#open.size) this.#drained?.();
  }

  #step(step: NativeGenerateStep): void {
    const n = this.#topN;
    for (let k = 0; k < step.rows.length; k++) {
      const id = step.rows[k];
      const o = this.#open.get(id);
      if (!o) continue;
      const token = step.tokens[k];
      const f = step.finish[k];
      if (token >= 0) {
        try {
          o.row.onToken?.({
            row: id,
            token,
            logprob: step.logprobs[k],
            ...(n ? { top: { ids: step.topIds.slice(k * n, (k + 1) * n), logprobs: step.topLogprobs.slice(k * n, (k + 1) * n) } } : {}),
            ...(f !== 255 ? { finish: FINISH[f] as 'length' | 'stop_token' | 'stop_string' } : {}),
          });
        } catch (e) {
          this.#call?.cancel(id);
          this.#end(id, o, 'cancelled', e);
          continue;
        }
      }
      if (f !== 255) this.#end(id, o, FINISH[f]);
    }
  }
}
