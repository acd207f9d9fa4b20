/** A training step's batch and options as Model.trainStep takes them, and their flattening into the native request. */
import type { NativeTrainRequest } from '../binding/types.js';
import { SlmError } from '../errors.js';

export interface TrainBatch {
  sequences: ArrayLike<number>[];
  /** Per token: 1 = trained target, 0 = prompt / tool output / retrieved text. */
  masks: ArrayLike<number>[];
  advantages?: ArrayLike<number>[];
  oldLogprobs?: ArrayLike<number>[];
  returns?: ArrayLike<number>[];
  oldValues?: ArrayLike<number>[];
  /** Per token: a factor on the entropy term's weight (absent: 1). */
  entropyScale?: ArrayLike<number>[];
  temperature?: number[];
}

export interface TrainOptions
  extends Omit<
    NativeTrainRequest,
    'ids' | 'lengths' | 'mask' | 'advantages' | 'oldLogprobs' | 'returns' | 'oldValues' | 'entropyScale' | 'temperature' | 'klEstimator'
  > {
  klEstimator?: 'k1' | 'k3';
}

/**
 * Per-sequence rows (one value per token) as one typed array for a native call, each row checked
 * against its sequence's length: a row too long and another too short would otherwise pass a total
 * count and misalign every value after them.
 */
export function flatRows<T extends Int32Array | Float32Array | Uint8Array>(
  rows: ArrayLike<number>[],
  lengths: Int32Array,
  Ctor: new (n: number) => T,
  what: string,
): T {
  if (rows.length !== lengths.length)
    throw new SlmError('ARGUMENT_INVALID', `${what}: expected one row per sequence (${lengths.length}), found ${rows.length}.`);
  const out = new Ctor(lengths.reduce((a, b) => a + b, 0));
  let o = 0;
  rows.forEach((r, i) => {
    if (r.length !== lengths[i]) throw new SlmError('ARGUMENT_INVALID', `${what}[${i}] has ${r.length} values for ${lengths[i]} tokens.`);
    for (let t = 0; t < r.length; t++) out[o + t] = r[t];
    o += r.length;
  });
  return out;
}

/** A training batch checked (ids against the vocabulary with `checkIds`) and flattened into the native request. */
export function nativeTrainRequest(batch: TrainBatch, opts: TrainOptions, checkIds: (ids: Int32Array) => void): NativeTrainRequest {
  const n = batch.sequences.length;
  if (batch.masks.length !== n)
    throw new SlmError('ARGUMENT_INVALID', `expected one loss mask per sequence (${n}), found ${batch.masks.length}.`);
  const lengths = Int32Array.from(batch.sequences.map((s) => s.length));
  const flat = <T extends Int32Array | Float32Array | Uint8Array>(
    rows: ArrayLike<number>[] | undefined,
    Ctor: new (n: number) => T,
    what: string,
  ): T | undefined => rows && flatRows(rows, lengths, Ctor, what);
  const ids = flat(batch.sequences, Int32Array, 'sequences')!;
  checkIds(ids);
  const req: NativeTrainRequest = {
    ...opts,
    klEstimator: opts.klEstimator === 'k1' ? 1 : 3,
    ids,
    lengths,
    mask: flat(batch.masks, Uint8Array, 'masks')!,
    advantages: flat(batch.advantages, Float32Array, 'advantages'),
    oldLogprobs: flat(batch.oldLogprobs, Float32Array, 'oldLogprobs'),
    returns: flat(batch.returns, Float32Array, 'returns'),
    oldValues: flat(batch.oldValues, Float32Array, 'oldValues'),
    entropyScale: flat(batch.entropyScale, Float32Array, 'entropyScale'),
    temperature: batch.temperature ? Float32Array.from(batch.temperature) : undefined,
  };
  return req;
}
