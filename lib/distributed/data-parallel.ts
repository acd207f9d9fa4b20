/**
 * Data-parallel LoRA training over a process group. Each rank holds a full copy of the model and
 * trains on its share of the global batch; one step is
 *   1. all-reduce of the ranks' trained-token and sequence counts (the global batch's),
 *   2. forward/backward on the local share with the loss weights of the *global* batch (each token
 *      weighs 1 / global tokens, or 1 / (global sequences x its sequence's tokens)), so the SUM of
 *      the ranks' gradients is exactly the single-process gradient of the whole batch,
 *   3. all-reduce (sum) of the flat LoRA (+ value head) gradient,
 *   4. the same gradient norm, clipping and AdamW on every rank, so the adapters stay identical.
 * The loss and its diagnostics are weighted sums with global weights too, so their all-reduced sums
 * are the global batch's values. Before the first step every rank takes rank 0's trainable tensors.
 */
import type { NativeTrainStats } from '../binding/types.js';
import type { Model, TrainBatch, TrainOptions } from '../engine/model.js';
import type { ProcessGroup } from './group.js';

/** The half-open range [lo, hi) of `n` items that `rank` of `world` takes (contiguous, sizes differ by at most 1). */
export function shardRange(n: number, rank: number, world: number): [number, number] {
  const base = Math.floor(n / world);
  const extra = n % world;
  const lo = rank * base + Math.min(rank, extra);
  return [lo, lo + base + (rank < extra ? 1 : 0)];
}

const STAT_KEYS = ['loss', 'pgLoss', 'sftLoss', 'kl', 'entropy', 'clipFrac', 'ratio', 'valueLoss'] as const;

/** Trained tokens (mask[t] = 1 for t >= 1, as the native loss counts them) and sequences with any. */
export function trainedCounts(masks: ArrayLike<number>[]): { tokens: number; sequences: number } {
  let tokens = 0;
  let sequences = 0;
  for (const m of masks) {
    let n = 0;
    for (let t = 1; t < m.length; t++) n += m[t] ? 1 : 0;
    tokens += n;
    sequences += n > 0 ? 1 : 0;
  }
  return { tokens, sequences };
}

export class DataParallel {
  private synced = false;
  /** Seconds spent in the gradient all-reduce per step, and its size in bytes (metrics, README). */
  lastAllReduceS = 0;
  lastAllReduceBytes = 0;

  constructor(readonly group: ProcessGroup) {}

  /** Every rank takes rank 0's trainable tensors (adapter and value head). */
  async syncParameters(model: Model): Promise<void> {
    const params = Object.entries(model.trainable());
    const flat = new Float32Array(params.reduce((a, [, v]) => a + v.length, 0));
    let o = 0;
    for (const [, v] of params) {
      flat.set(v, o);
      o += v.length;
    }
    await this.group.broadcast(flat, 0);
    o = 0;
    for (const [k, v] of params) {
      model.setTrainable(k, flat.subarray(o, o + v.length).slice());
      o += v.length;
    }
    this.synced = true;
  }

  async trainStep(model: Model, batch: TrainBatch, opts: TrainOptions): Promise<NativeTrainStats> {
    if (!this.synced) await this.syncParameters(model);
    const local = trainedCounts(batch.masks);
    const [tokens, sequences] = await this.group.allReduceValues([local.tokens, local.sequences]);
    const stats = await model.trainStepLocal(batch, { ...opts, update: false, normTokens: tokens, normSequences: sequences });
    if (tokens === 0)
      return { ...stats, tokens: 0, sequences: 0, skipped: true, skipReason: 'no trained tokens on any rank (every loss mask is 0)' };
    const grads = model.gradients();
    const t0 = performance.now();
    await this.group.allReduce(grads);
    this.lastAllReduceS = (performance.now() - t0) / 1e3;
    this.lastAllReduceBytes = grads.byteLength;
    const sums = await this.group.allReduceValues(STAT_KEYS.map((k) => (local.tokens ? stats[k] : 0)));
    const global = Object.fromEntries(STAT_KEYS.map((k, i) => [k, sums[i]])) as Pick<NativeTrainStats, (typeof STAT_KEYS)[number]>;
    const { lr, valueLr, beta1, beta2, eps, weightDecay, maxGradNorm, criticMaxGradNorm } = opts;
    const applied = await model.applyGradients(
      {
        lr,
        valueLr,
        beta1,
        beta2,
        eps,
        weightDecay,
        maxGradNorm: maxGradNorm ?? 1,
        criticMaxGradNorm,
        loss: global.loss,
        valueLoss: global.valueLoss,
      },
      grads,
    );
    return {
      ...stats,
      ...global,
      gradNorm: applied.gradNorm,
      criticGradNorm: applied.criticGradNorm,
      skipped: applied.skipped,
      skipReason: applied.skipReason,
      tokens,
      sequences,
    };
  }
}
