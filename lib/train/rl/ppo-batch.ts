/**
 * PPO's batch mechanics (lib/train/rl/ppo.ts is the algorithm): the forward passes of step 3 (values,
 * reference and old log-probs), step 4's token rewards, GAE and whitening over the batch (gathered
 * across data-parallel ranks), and step 5's seeded mini-batch updates. The native loss weighs masked
 * tokens by 0 rather than dropping them: the per-token arrays hold 0 there.
 */
import type { Model } from '../../engine/model.js';
import type { NativeTrainStats } from '../../binding/types.js';
import { ppoAdvantages, type KlEstimator, type PpoAdvantages } from './gae.js';
import { permutation } from '../run.js';
import type { Shard } from '../../distributed/run.js';
import type { AdamOptions, TrainEpisode } from '../types.js';

/** What one optimizer pass trains on: per-token arrays aligned with the ids (0 where the mask is 0). */
export interface PpoBatch {
  sequences: Int32Array[];
  masks: Uint8Array[];
  oldLogprobs: Float32Array[];
  temperature: number[];
  advantages: Float32Array[];
  returns: Float32Array[];
  oldValues: Float32Array[];
}

export interface PpoStepInfo {
  step: number;
  /** Every episode of the step, as the rollout returned them. */
  episodes: TrainEpisode[];
  /** Indices (into the step's episodes) of the episodes trained on: those with a trained token. */
  kept: number[];
  scores: number[];
  /** Reference log-probs of the kept episodes (undefined without a KL penalty). */
  refLogprobs?: Float32Array[];
  /** Token rewards, advantages (whitened), returns of the kept episodes. */
  adv: PpoAdvantages;
  batch: PpoBatch;
}

export interface PpoPrepareOptions {
  gamma: number;
  lam: number;
  whiten: boolean;
  klCoef: number;
  klIn: 'reward' | 'loss';
  klEstimator: KlEstimator;
  recomputeOldLogprobs: boolean;
  checkpoint: boolean;
}

/**
 * Steps 3-4 for a batch of scored episodes: values, reference and old log-probs, token rewards, GAE,
 * whitening. Episodes without a trained token (index 0 never is: nothing predicts it) are left out.
 */
export async function ppoPrepare(
  model: Model,
  episodes: TrainEpisode[],
  scores: number[],
  o: PpoPrepareOptions,
): Promise<{ kept: number[]; batch: PpoBatch; adv: PpoAdvantages; refLogprobs?: Float32Array[] }> {
  return ppoAdvantagesFor(await ppoForward(model, episodes, o), scores, o);
}

/** The model's part of step 3 for the episodes with a trained token (`kept`): per-token arrays, 0 off the mask. */
export interface PpoForward {
  kept: number[];
  sequences: Int32Array[];
  masks: Uint8Array[];
  temperature: number[];
  oldLogprobs: Float32Array[];
  oldValues: Float32Array[];
  refLogprobs?: Float32Array[];
}

/** Step 4 (token rewards, GAE, whitening over every kept episode) for prepared episodes; `scores` by episode index. */
export function ppoAdvantagesFor(
  forward: PpoForward,
  scores: number[],
  opts: Pick<PpoPrepareOptions, 'gamma' | 'lam' | 'whiten' | 'klCoef' | 'klIn' | 'klEstimator'>,
): { kept: number[]; batch: PpoBatch; adv: PpoAdvantages; refLogprobs?: Float32Array[] } {
  const { kept, sequences, masks, temperature, oldLogprobs, oldValues, refLogprobs } = forward;
  const adv = ppoAdvantages(
    kept.map((i, j) => ({
      mask: masks[j],
      score: scores[i],
      logprobs: oldLogprobs[j],
      refLogprobs: refLogprobs?.[j],
      values: oldValues[j],
    })),
    {
      gamma: opts.gamma,
      lam: opts.lam,
      whiten: opts.whiten,
      klCoef: opts.klIn === 'reward' ? opts.klCoef : 0,
      klEstimator: opts.klEstimator,
    },
  );
  return {
    kept,
    refLogprobs,
    adv,
    batch: { sequences, masks, oldLogprobs, temperature, advantages: adv.advantages, returns: adv.returns, oldValues },
  };
}

/** Every rank's PpoForward and scores, in rank order (= the global batch's order), with `kept` as global episode indices. */
export async function gatherForward(
  shard: Shard,
  ppoForward: PpoForward,
  offset: number,
  scores: number[],
): Promise<{ forward: PpoForward; scores: number[] }> {
  const rows = (xs: ArrayLike<number>[]) => xs.map((x) => Array.from(x));
  const all = await shard.allGather({
    scores,
    kept: ppoForward.kept.map((i) => i + offset),
    sequences: rows(ppoForward.sequences),
    masks: rows(ppoForward.masks),
    temperature: ppoForward.temperature,
    oldLogprobs: rows(ppoForward.oldLogprobs),
    oldValues: rows(ppoForward.oldValues),
    refLogprobs: ppoForward.refLogprobs ? rows(ppoForward.refLogprobs) : null,
  });
  const cat = <T>(pick: (r: (typeof all)[number]) => number[][], Ctor: { from(x: number[]): T }) =>
    all.flatMap((r) => pick(r).map((x) => Ctor.from(x)));
  const forward = {
    kept: all.flatMap((r) => r.kept),
    sequences: cat((r) => r.sequences, Int32Array),
    masks: cat((r) => r.masks, Uint8Array),
    temperature: all.flatMap((r) => r.temperature),
    oldLogprobs: cat((r) => r.oldLogprobs, Float32Array),
    oldValues: cat((r) => r.oldValues, Float32Array),
    refLogprobs: all[0].refLogprobs ? cat((r) => r.refLogprobs as number[][], Float32Array) : undefined,
  };
  return { forward, scores: all.flatMap((r) => r.scores) };
}

export async function ppoForward(model: Model, episodes: TrainEpisode[], opts: PpoPrepareOptions): Promise<PpoForward> {
  const masks = episodes.map((e) => {
    const m = Uint8Array.from(e.lossMask, (x) => (x ? 1 : 0));
    if (m.length) m[0] = 0;
    return m;
  });
  const kept = episodes.map((_, i) => i).filter((i) => masks[i].some((x) => x));
  const sequences = kept.map((i) => episodes[i].ids);
  const keptMasks = kept.map((i) => masks[i]);
  const temperature = kept.map((i) => episodes[i].lossTemperature ?? episodes[i].temperature);
  const oldLogprobs = opts.recomputeOldLogprobs
    ? await model.sequenceLogprobs(sequences, temperature, keptMasks)
    : kept.map((i, j) => Float32Array.from(episodes[i].logprobs, (x, t) => (keptMasks[j][t] ? x : 0)));
  const oldValues = await model.values(sequences, keptMasks);
  const refLogprobs =
    opts.klCoef > 0 && opts.klIn === 'reward' ? await model.referenceLogprobs(sequences, temperature, keptMasks) : undefined;
  return { kept, sequences, masks: keptMasks, temperature, oldLogprobs, oldValues, refLogprobs };
}

export interface PpoUpdateOptions {
  epochs: number;
  /** Episodes per optimizer step (<= 0 or undefined: all). */
  miniBatch?: number;
  /** Seeds the mini-batch order and the native RNG (LoRA dropout). */
  seed: number;
  lr: number;
  valueLr: number;
  clipLow: number;
  clipHigh: number;
  /** KL in the loss (0 when the KL is in the reward). */
  klCoef: number;
  klEstimator: 'k1' | 'k3';
  entropyCoef: number;
  vfCoef: number;
  valueClip: number;
  tokenLevel: boolean;
  weightDecay: number;
  maxGradNorm: number;
  /** The separate critic's own clip (undefined: maxGradNorm). */
  criticMaxGradNorm?: number;
  /** AdamW's betas and eps (optim.betas, optim.eps); default 0.9, 0.999, 1e-8. */
  adam?: AdamOptions;
  microBatch?: number;
  checkpoint: boolean;
  /**
   * Data-parallel: which of the batch's episodes this rank trains on (the others' gradients come from
   * their ranks through the all-reduce). Every rank walks the same mini-batches and takes part in
   * every step, with or without members of its own.
   */
  mine?: (i: number) => boolean;
}

/** Step 5: `epochs` passes of seeded mini-batches, one native train step (policy + value loss) each. */
export async function ppoUpdate(model: Model, batch: PpoBatch, opts: PpoUpdateOptions): Promise<NativeTrainStats[]> {
  const N = batch.sequences.length;
  const mb = opts.miniBatch && opts.miniBatch > 0 ? Math.min(opts.miniBatch, N) : N;
  const stats: NativeTrainStats[] = [];
  for (let e = 0; e < opts.epochs; e++) {
    const order = permutation(N, opts.seed, e);
    for (let s = 0, k = 0; s < N; s += mb, k++) {
      const idx = order.slice(s, s + mb).filter((i) => !opts.mine || opts.mine(i));
      const pick = <T>(xs: T[]) => idx.map((i) => xs[i]);
      stats.push(
        await model.trainStep(
          {
            sequences: pick(batch.sequences),
            masks: pick(batch.masks),
            advantages: pick(batch.advantages),
            oldLogprobs: pick(batch.oldLogprobs),
            returns: pick(batch.returns),
            oldValues: pick(batch.oldValues),
            temperature: pick(batch.temperature),
          },
          {
            loss: 'pg',
            seed: opts.seed * 1000003 + e * 7919 + k,
            lr: opts.lr,
            valueLr: opts.valueLr,
            clipLow: opts.clipLow,
            clipHigh: opts.clipHigh,
            klCoef: opts.klCoef,
            klEstimator: opts.klEstimator,
            entropyCoef: opts.entropyCoef,
            vfCoef: opts.vfCoef,
            valueClip: opts.valueClip,
            tokenLevel: opts.tokenLevel,
            weightDecay: opts.weightDecay,
            maxGradNorm: opts.maxGradNorm,
            criticMaxGradNorm: opts.criticMaxGradNorm,
            ...opts.adam,
            microBatch: opts.microBatch,
            checkpoint: opts.checkpoint,
          },
        ),
      );
    }
  }
  return stats;
}
