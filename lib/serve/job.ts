/**
 * One choice of one request as the server's batching queue runs it: a row of a generate call,
 * which collects its sampled tokens and log-probs, makes its text (streamed pieces or the whole
 * text) and settles with how it ended.
 */
import type { TokenEvent } from '../engine/types.js';
import type { Sampling } from './request.js';
import { IncrementalText } from './text.js';

type Top = { ids: Int32Array; logprobs: Float32Array } | undefined;

export interface RowResult {
  text: string;
  finish: 'stop' | 'length' | 'cancelled';
}

/** One choice of one request: a row of a generate call. */
export class Job {
  readonly ids: number[] = [];
  readonly logprobs: number[] = [];
  readonly top: Top[] = [];
  readonly abort = new AbortController();
  readonly result: Promise<RowResult>;
  ended = false;
  /** Streaming: text that can be sent now (and, at the end, the row's result). */
  listener?: (piece: string, end?: RowResult) => void;
  private text: IncrementalText;
  private settle!: { resolve: (r: RowResult) => void; reject: (e: Error) => void };

  constructor(
    readonly prompt: Int32Array,
    readonly s: Sampling,
    readonly seed: number,
    decode: (ids: number[]) => string,
  ) {
    this.text = new IncrementalText(decode, s.stop, s.keepStop);
    this.result = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
    this.result.catch(() => {}); // a failed call rejects every row; the request handler reports it
  }

  /** A sampled token of this row (from the engine, as it is sampled). */
  token(ev: TokenEvent): void {
    if (this.ended) return;
    this.ids.push(ev.token);
    this.logprobs.push(ev.logprob);
    this.top.push(ev.top);
    // A stop token ends the text unseen unless include_stop_str_in_output (vLLM). Only a streamed
    // row decodes as it goes (its listener is set before the call starts); the others decode once.
    if (this.listener && (ev.finish !== 'stop_token' || this.s.keepStop)) this.text.push(ev.token);
    if (ev.finish) this.end(ev.finish);
    else this.listener?.(this.text.take());
  }

  end(reason: 'stop_token' | 'stop_string' | 'length' | 'cancelled'): void {
    if (this.ended) return;
    this.ended = true;
    if (reason === 'cancelled') {
      this.settle.resolve({ text: '', finish: 'cancelled' });
      return;
    }
    const textIds = reason === 'stop_token' && !this.s.keepStop ? this.ids.slice(0, -1) : this.ids;
    const { text, rest, cut } = this.text.finish(textIds);
    const r: RowResult = { text, finish: reason === 'length' && !cut ? 'length' : 'stop' };
    this.listener?.(rest, r);
    this.settle.resolve(r);
  }

  fail(e: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.settle.reject(e);
  }

  get mismatch(): boolean {
    return this.text.mismatch;
  }
}
