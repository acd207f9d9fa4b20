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
export async function ppoPrepare(model: Model, episodes: TrainEpisode[], scores: number[], o: PpoPrepareOptions): Promise<{ kept: number[]; batch: PpoBatch; adv: PpoAdvantages; refLogprobs?: Float32Array[] }> {
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
export function ppoAdvantagesFor(f: PpoForward, scores: number[], o: Pick<PpoPrepareOptions, 'gamma' | 'lam' | 'whiten' | 'klCoef' | 'klIn' | 'klEstimator'>): { kept: number[]; batch: PpoBatch; adv: PpoAdvantages; refLogprobs?: Float32Array[] } {
  const { kept, sequences, masks, temperature, oldLogprobs, oldValues, refLogprobs } = f;
  const adv = ppoAdvantages(
    kept.map((i, j) => ({ mask: masks[j], score: scores[i], logprobs: oldLogprobs[j], refLogprobs: refLogprobs?.[j], values: oldValues[j] })),
    { gamma: o.gamma, lam: o.lam, whiten: o.whiten, klCoef: o.klIn === 'reward' ? o.klCoef : 0, klEstimator: o.klEstimator },
  );
  return { kept, refLogprobs, adv, batch: { sequences, masks, oldLogprobs, temperature, advantages: adv.advantages, returns: adv.returns, oldValues } };
}

/** Every rank's PpoForward and scores, in rank order (= the global batch's order), with `kept` as global episode indices. */
export async function gatherForward(shard: Shard, f: PpoForward, offset: number, scores: number[]): Promise<{ forward: PpoForward; scores: number[] }> {
  const rows = (xs: ArrayLike<number>[]) => xs.map((x) => Array.from(x));
  const all = await shard.allGather({
    scores,
    kept: f.kept.map((i) => i + offset),
    sequences: rows(f.sequences),
    masks: rows(f.masks),
    temperature: f.temperature,
    oldLogprobs: rows(f.oldLogprobs),
    oldValues: rows(f.oldValues),
    refLogprobs: f.refLogprobs ? rows(f.refLogprobs) : null,
  });
  const cat = <T>(pick: (r: (typeof all)[number]) => number[][], Ctor: { from(x: number[]): T }) => all.flatMap((r) => pick(r).map((x) => Ctor.from(x)));
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

export async function ppoForward(model: Model, episodes: TrainEpisode[], o: PpoPrepareOptions): Promise<PpoForward> {
  const masks = episodes.map((e) => {
    const m = Uint8Array.from(e.lossMask, (x) => (x ? 1 : 0));
    if (m.length) m[0] = 0;
    return m;
  });
  const kept = episodes.map((_, i) => i).filter((i) => masks[i].some((x) => x));
  const sequences = kept.map((i) => episodes[i].ids);
  const keptMasks = kept.map((i) => masks[i]);
  const temperature = kept.map((i) => episodes[i].lossTemperature ?? episodes[i].temperature);
  const oldLogprobs = o.recomputeOldLogprobs
    ? await model.sequenceLogprobs(sequences, temperature, keptMasks)
    : kept.map((i, j) => Float32Array.from(episodes[i].logprobs, (x, t) => (keptMasks[j][t] ? x : 0)));
  const oldValues = await model.values(sequences, keptMasks);
  const refLogprobs = o.klCoef > 0 && o.klIn === 'reward' ? await model.referenceLogprobs(sequences, temperature, keptMasks) : undefined;
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
export async function ppoUpdate(model: Model, b: PpoBatch, o: PpoUpdateOptions): Promise<NativeTrainStats[]> {
  const N = b.sequences.length;
  const mb = o.miniBatch && o.miniBatch > 0 ? Math.min(o.miniBatch, N) : N;
  const stats: NativeTrainStats[] = [];
  for (let e = 0; e < o.epochs; e++) {
    const order = permutation(N, o.seed, e);
    for (let s = 0, k = 0; s < N; s += mb, k++) {
      const idx = order.slice(s, s + mb).filter((i) => !o.mine || o.mine(i));
      const pick = <T>(xs: T[]) => idx.map((i) => xs[i]);
      stats.push(
        await model.trainStep(
          {
            sequences: pick(b.sequences),
            masks: pick(b.masks),
            advantages: pick(b.advantages),
            oldLogprobs: pick(b.oldLogprobs),
            returns: pick(b.returns),
            oldValues: pick(b.oldValues),
            temperature: pick(b.temperature),
          },
          {
            loss: 'pg',
            seed: o.seed * 1000003 + e * 7919 + k,
            lr: o.lr,
            valueLr: o.valueLr,
            clipLow: o.clipLow,
            clipHigh: o.clipHigh,
            klCoef: o.klCoef,
            klEstimator: o.klEstimator,
            entropyCoef: o.entropyCoef,
            vfCoef: o.vfCoef,
            valueClip: o.valueClip,
            tokenLevel: o.tokenLevel,
            weightDecay: o.weightDecay,
            maxGradNorm: o.maxGradNorm,
            criticMaxGradNorm: o.criticMaxGradNorm,
            ...o.adam,
            microBatch: o.microBatch,
            checkpoint: o.checkpoint,
          },
        ),
      );
    }
  }
  return stats;
}
