/**
 * PPO over real episodes, as Search-R1 runs it on verl. One step:
 *   1. take the next questions (seeded order, resumable), `n` rollouts each (1 by default: PPO needs
 *      no group), every rollout with its own temperature drawn from the configured range;
 *   2. score every episode (each reward part kept for the logs);
 *   3. the critic's values on every trained token (the value head on the policy's hidden states), the
 *      reference log-probs (adapter off) when the KL penalty is on, and the old log-probs (the
 *      sampling log-probs, or a fresh forward with `recomputeOldLogprobs`);
 *   4. token rewards (score on the last trained token, -kl_coef * KL on every trained token when the KL
 *      goes into the reward), GAE over the trained tokens only (masked environment text is skipped),
 *      advantages whitened over the batch (lib/train/advantages.ts `ppoAdvantages`);
 *   5. `ppoEpochs` passes over the episodes in seeded mini-batches, one optimizer step each: clipped
 *      policy loss against the old log-probs + vf_coef * clipped value loss (one native call; the value
 *      head gets its own learning rate), token-mean over the mini-batch's trained tokens;
 *   6. metrics row, trajectories JSONL, checkpoints (adapter, value head, optimizer, data position).
 * How this departs from verl's PPO:
 *   - the critic is a value head on the policy's own LoRA'd trunk, not a separate model: the value
 *     loss's gradient also reaches the LoRA weights, and gradient-norm clipping covers actor and
 *     critic together;
 *   - values are read through Model.values: one native forward, adapter on, dropout off (the
 *     training forward samples LoRA dropout, so with dropout > 0 the loss sees slightly different
 *     values, as verl's critic in train mode does);
 *   - the value clip fraction and the old/new policy KL (verl actor/ppo_kl) are not reported (the
 *     native step does not count them; the mean ratio is);
 *   - LoRA on a frozen base rather than full fine-tuning (Search-R1 updates every weight).
 * The native loss weighs masked tokens by 0 rather than dropping them: the per-token arrays must hold
 * finite, moderate values there (ppoPrepare writes 0), or an overflow would make the loss NaN and
 * skip the step.
 */
import type { Model } from '../engine/model.js';
import type { LoraSpec } from '../engine/adapter.js';
import type { NativeTrainStats } from '../binding/types.js';
import { SlmError } from '../errors.js';
import { ppoAdvantages, type KlEstimator, type PpoAdvantages } from './advantages.js';
import { Progress, type ProgressTo } from '../util/progress.js';
import { beginStage, endStep, rolloutRequests, type AdamOptions, type RewardResult, type RolloutFn, type TrainEpisode } from './grpo.js';
import { learningRate, type ScheduleSpec } from './schedule.js';
import { permutation, type RunFolder, type TrainState } from './run.js';
import { mean, rolloutMetrics, trajectoryLine } from './rollout-metrics.js';
import { shardRange } from '../distributed/data-parallel.js';
import { gatherRollouts } from '../distributed/gather.js';
import type { Shard } from '../distributed/run.js';

export interface PpoDeps<Q> {
  rollout: RolloutFn<Q>;
  reward(ep: TrainEpisode, q: Q): Promise<RewardResult>;
}

type Schedule = Omit<ScheduleSpec, 'totalSteps'> & { totalSteps?: number };

export interface PpoOptions {
  lora: LoraSpec;
  /** Rollouts per question (default 1). */
  n?: number;
  questionsPerStep: number;
  steps: number;
  temperature: number | [number, number];
  /** rollout.top_p: a range is drawn per rollout (rolloutTopP); one value is the runner's. */
  topP?: number | [number, number];
  /** Passes over a step's episodes (verl ppo_epochs; default 1). */
  ppoEpochs?: number;
  /** Episodes per optimizer step (verl ppo_mini_batch_size); default: all of the step's episodes. */
  miniBatch?: number;
  clipLow?: number;
  clipHigh?: number;
  /** GAE discount and lambda (Search-R1: 1 and 1). */
  gamma?: number;
  lam?: number;
  /** Whiten the advantages over the batch's trained tokens (default true, as verl). */
  whiten?: boolean;
  /** KL to the reference (see klReference); default 0.001 (Search-R1). */
  klCoef?: number;
  /** 'reward' (default, verl's kl_ctrl in the token rewards) or 'loss' (a KL term in the native loss). */
  klIn?: 'reward' | 'loss';
  /** k1 by default; the loss supports k1 and k3, the reward k1, k2 and k3. */
  klEstimator?: KlEstimator;
  /** Value-loss coefficient (default 0.5) and clip range around the old values (default 0.5). */
  vfCoef?: number;
  valueClip?: number;
  entropyCoef?: number;
  /** Token-mean over the mini-batch (default true, verl's token-mean); false: per-sequence means. */
  tokenLevel?: boolean;
  /** The actor's (LoRA) learning-rate schedule. */
  schedule: Schedule;
  /** The critic's (value head) schedule; default: the actor's with `criticLr` (or the actor's lr). */
  criticSchedule?: Schedule;
  criticLr?: number;
  /** First steps that train only the critic (verl trainer.critic_warmup; default 0). */
  criticWarmup?: number;
  /** Old log-probs from a forward pass before the update instead of the sampling log-probs. */
  recomputeOldLogprobs?: boolean;
  weightDecay?: number;
  maxGradNorm?: number;
  adam?: AdamOptions;
  microBatch?: number;
  gradientCheckpointing?: boolean;
  seed: number;
  checkpointEvery?: number;
  resume?: boolean;
  /** Keep the adapter already on the model (e.g. from SFT) instead of attaching a fresh one. */
  keepAdapter?: boolean;
  /** The KL reference: the adapter the stage starts from, frozen ('start', default), or the base model. */
  klReference?: 'start' | 'base';
  stopAfter?: number;
  /** Called after each step's metrics row (awaited: e.g. an evaluation every N steps). */
  onStep?: (row: Record<string, unknown>) => void | Promise<void>;
  /**
   * Data-parallel rank (lib/distributed): this process rolls out its share of each step's questions
   * and computes their values and log-probs; the prepared episodes are gathered so that every rank
   * computes the same advantages (whitening over the global batch) and walks the same mini-batches,
   * training on the members it rolled out (the model's trainStep all-reduces the gradients).
   */
  shard?: Shard;
  /** Sees every step's prepared batch before the update (tests, debugging). */
  onBatch?: (info: PpoStepInfo) => void | Promise<void>;
  /** Where the steps' progress bar goes (default: none). */
  progress?: ProgressTo;
}

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

/** Runs `fn` once per distinct temperature over the rows that share it; results in row order. */
async function byTemperature(rows: Int32Array[], temps: number[], fn: (rows: Int32Array[], t: number) => Promise<Float32Array[]>): Promise<Float32Array[]> {
  const out: Float32Array[] = new Array(rows.length);
  for (const t of [...new Set(temps)]) {
    const idx = temps.map((x, i) => (x === t ? i : -1)).filter((i) => i >= 0);
    const r = await fn(
      idx.map((i) => rows[i]),
      t,
    );
    idx.forEach((i, j) => (out[i] = r[j]));
  }
  return out;
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
async function gatherForward(shard: Shard, f: PpoForward, offset: number, scores: number[]): Promise<{ forward: PpoForward; scores: number[] }> {
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

async function ppoForward(model: Model, episodes: TrainEpisode[], o: PpoPrepareOptions): Promise<PpoForward> {
  const masks = episodes.map((e) => {
    const m = Uint8Array.from(e.lossMask, (x) => (x ? 1 : 0));
    if (m.length) m[0] = 0;
    return m;
  });
  const kept = episodes.map((_, i) => i).filter((i) => masks[i].some((x) => x));
  const sequences = kept.map((i) => episodes[i].ids);
  const keptMasks = kept.map((i) => masks[i]);
  const temperature = kept.map((i) => episodes[i].temperature);
  const oldLogprobs = o.recomputeOldLogprobs
    ? (await byTemperature(sequences, temperature, (r, t) => model.sequenceLogprobs(r, t))).map((lp, j) => lp.map((x, t) => (keptMasks[j][t] ? x : 0)))
    : kept.map((i, j) => Float32Array.from(episodes[i].logprobs, (x, t) => (keptMasks[j][t] ? x : 0)));
  const oldValues = await model.values(sequences, keptMasks);
  const refLogprobs = o.klCoef > 0 && o.klIn === 'reward' ? await byTemperature(sequences, temperature, (r, t) => model.referenceLogprobs(r, t)) : undefined;
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

/** Mean and (population) variance over the entries where the mask is 1. */
function maskedStats(xs: Float32Array[], masks: Uint8Array[]): { mean: number; var: number; n: number } {
  let n = 0;
  let s = 0;
  xs.forEach((x, i) => x.forEach((v, t) => masks[i][t] && (n++, (s += v))));
  const m = n ? s / n : NaN;
  let ss = 0;
  xs.forEach((x, i) => x.forEach((v, t) => masks[i][t] && (ss += (v - m) ** 2)));
  return { mean: m, var: n ? ss / n : NaN, n };
}

export async function runPpo<Q>(model: Model, questions: Q[], run: RunFolder, deps: PpoDeps<Q>, o: PpoOptions): Promise<{ steps: number; meanReward: number[] }> {
  const n = o.n ?? 1;
  const klCoef = o.klCoef ?? 0.001;
  const klIn = o.klIn ?? 'reward';
  const klEstimator = o.klEstimator ?? 'k1';
  if (klIn === 'loss' && klCoef > 0 && klEstimator === 'k2') throw new SlmError('CONFIG_INVALID', 'the KL term in the loss supports k1 and k3, found k2; use k2 with klIn "reward".');
  if (!Number.isInteger(n) || n < 1) throw new SlmError('CONFIG_INVALID', `n (rollouts per question) must be a positive integer, found ${n}.`);
  const perEpoch = Math.max(1, Math.floor(questions.length / o.questionsPerStep));
  const actor: ScheduleSpec = { ...o.schedule, totalSteps: o.schedule.totalSteps ?? o.steps };
  const criticBase = o.criticSchedule ?? (o.criticLr !== undefined ? { ...o.schedule, lr: o.criticLr } : undefined);
  const critic: ScheduleSpec | undefined = criticBase && { ...criticBase, totalSteps: criticBase.totalSteps ?? o.steps };
  const checkpoint = o.gradientCheckpointing ?? true;
  const begun = await beginStage(model, run, o);
  let state: TrainState = begun.state;
  if (o.resume) {
    if (!model.hasValueHead()) throw new SlmError('CHECKPOINT_INVALID', `--resume: the latest checkpoint in ${run.dir} has no value head (value_head.safetensors); it is not a PPO checkpoint.`);
  } else if (begun.fresh || !model.hasValueHead()) model.attachValueHead(o.seed + 1);
  const rewardsByStep: number[] = [];
  let ranHere = 0;
  const bar = new Progress('ppo', o.steps, 'steps', o.progress, state.step);
  try {
    while (state.step < o.steps) {
      if (o.stopAfter !== undefined && ranHere >= o.stopAfter) break;
      const order = permutation(questions.length, o.seed, state.epoch);
      const stepQs = order.slice(state.batchInEpoch * o.questionsPerStep, (state.batchInEpoch + 1) * o.questionsPerStep).map((i) => questions[i]);
      // This rank's share (all of it in one process); temperatures and seeds by the global index.
      const [q0, q1] = o.shard ? shardRange(stepQs.length, o.shard.rank, o.shard.world) : [0, stepQs.length];
      const qs = stepQs.slice(q0, q1);
      const offset = q0 * n; // the global index of this rank's first episode
      // 1. rollouts
      const t0 = performance.now();
      const reqs = rolloutRequests(qs, q0, n, state.step, o);
      bar.set({ detail: `rollouts 0/${reqs.length}` });
      const episodes = await deps.rollout(reqs, (done, total) => bar.set({ detail: `rollouts ${done}/${total}` }));
      if (episodes.length !== reqs.length) throw new SlmError('ARGUMENT_INVALID', `rollout returned ${episodes.length} episodes for ${reqs.length} requests.`);
      const tRollout = (performance.now() - t0) / 1e3;
      // 2. rewards
      bar.set({ detail: 'reward' });
      const t1 = performance.now();
      const rewards = await Promise.all(episodes.map((ep, i) => deps.reward(ep, reqs[i].question)));
      const tReward = (performance.now() - t1) / 1e3;
      // 3-4. values, reference, advantages
      bar.set({ detail: 'values and advantages' });
      const t2 = performance.now();
      const scores = rewards.map((r) => r.total);
      const prepOpts: PpoPrepareOptions = {
        gamma: o.gamma ?? 1,
        lam: o.lam ?? 1,
        whiten: o.whiten ?? true,
        klCoef,
        klIn,
        klEstimator,
        recomputeOldLogprobs: o.recomputeOldLogprobs ?? false,
        checkpoint,
      };
      // Each rank's forward passes cover its own episodes; the advantages (whitened over the whole
      // batch) are computed from every rank's, identically on every rank.
      // reward.on_failure: exclude — an episode whose reward failed trains nothing (no trained token).
      const trained = episodes.map((e, i) => (rewards[i].excluded === true ? { ...e, lossMask: new Uint8Array(e.lossMask.length) } : e));
      const fwd = await ppoForward(model, trained, prepOpts);
      const global = o.shard ? await gatherForward(o.shard, fwd, offset, scores) : { forward: fwd, scores };
      const allScores = global.scores;
      const prep = ppoAdvantagesFor(global.forward, allScores, prepOpts);
      const tPrepare = (performance.now() - t2) / 1e3;
      await o.onBatch?.({ step: state.step + 1, episodes, kept: prep.kept, scores, refLogprobs: prep.refLogprobs, adv: prep.adv, batch: prep.batch });
      // 5. update
      bar.set({ detail: `train (${prep.kept.length} episodes)` });
      const t3 = performance.now();
      const lr = learningRate(actor, state.step);
      const valueLr = critic ? learningRate(critic, state.step) : lr;
      const warm = state.step < (o.criticWarmup ?? 0);
      let stats: NativeTrainStats[] = [];
      if (prep.kept.length) {
        const b = warm ? { ...prep.batch, advantages: prep.batch.advantages.map((a) => new Float32Array(a.length)) } : prep.batch;
        stats = await ppoUpdate(model, b, {
          epochs: o.ppoEpochs ?? 1,
          miniBatch: o.miniBatch,
          seed: o.seed * 31 + state.step,
          lr: warm ? 0 : lr,
          valueLr,
          clipLow: o.clipLow ?? 0.2,
          clipHigh: o.clipHigh ?? o.clipLow ?? 0.2,
          klCoef: klIn === 'loss' && !warm ? klCoef : 0,
          klEstimator: klEstimator === 'k3' ? 'k3' : 'k1',
          entropyCoef: warm ? 0 : (o.entropyCoef ?? 0),
          vfCoef: o.vfCoef ?? 0.5,
          valueClip: o.valueClip ?? 0.5,
          tokenLevel: o.tokenLevel ?? true,
          weightDecay: o.weightDecay ?? 0,
          maxGradNorm: o.maxGradNorm ?? 1,
          adam: o.adam,
          microBatch: o.microBatch,
          checkpoint,
          mine: o.shard ? (i) => prep.kept[i] >= offset && prep.kept[i] < offset + episodes.length : undefined,
        });
      }
      const tTrain = (performance.now() - t3) / 1e3;
      // 6. logs
      const totals = allScores;
      const pos = new Map(prep.kept.map((g, j) => [g, j]));
      const firstTrained = (m: Uint8Array) => m.findIndex((x) => x === 1);
      const { masks, oldValues } = prep.batch;
      const lines = episodes.map((e, i) => {
        const j = pos.get(offset + i);
        const f = j === undefined ? -1 : firstTrained(masks[j]);
        return trajectoryLine(state.step + 1, reqs[i].question, e, rewards[i], { value: f >= 0 ? oldValues[j!][f] : null, return: f >= 0 ? prep.adv.returns[j!][f] : null });
      });
      const all = o.shard ? await gatherRollouts(o.shard, episodes, rewards, [], [], lines) : { episodes, rewards, lines };
      const done = stats.filter((s) => !s.skipped);
      const sm = (k: keyof NativeTrainStats) => (done.length ? mean(done.map((s) => s[k] as number)) : undefined);
      const v = maskedStats(oldValues, masks);
      const ret = maskedStats(prep.adv.returns, masks);
      const resid = maskedStats(
        prep.adv.returns.map((r, i) => r.map((x, t) => x - oldValues[i][t])),
        masks,
      );
      const advStats = maskedStats(prep.adv.advantages, masks);
      const row: Record<string, unknown> = {
        stage: 'ppo',
        step: state.step + 1,
        lr: warm ? 0 : lr,
        critic_lr: valueLr,
        critic_warmup: warm || undefined,
        ...rolloutMetrics(all.episodes, all.rewards),
        episodes_trained: prep.kept.length,
        episodes_excluded: all.rewards.filter((r) => r.excluded === true).length || undefined,
        episodes_empty: all.episodes.length - prep.kept.length - all.rewards.filter((r) => r.excluded === true).length || undefined,
        kl: klIn === 'reward' ? prep.adv.klMean : sm('kl'),
        kl_coef: klCoef,
        values_mean: v.mean,
        returns_mean: ret.mean,
        advantages_mean: advStats.mean,
        advantages_std: Math.sqrt(advStats.var),
        explained_var: ret.n ? 1 - resid.var / (ret.var + 1e-5) : undefined,
        loss: sm('loss'),
        pg_loss: sm('pgLoss'),
        vf_loss: sm('valueLoss'),
        entropy: sm('entropy'),
        pg_clipfrac: sm('clipFrac'),
        ratio_mean: sm('ratio'),
        grad_norm: sm('gradNorm'),
        optimizer_steps: done.length,
        updates_skipped: stats.length - done.length || undefined,
        time_rollout_s: tRollout,
        time_reward_s: tReward,
        time_prepare_s: tPrepare,
        time_train_s: tTrain,
        time_step_s: (performance.now() - t0) / 1e3,
      };
      rewardsByStep.push(mean(totals));
      state = await endStep({ model, run, bar, row, lines: all.lines, state, perEpoch, shard: o.shard, onStep: o.onStep, checkpointEvery: o.checkpointEvery });
      ranHere++;
    }
  } finally {
    bar.stop();
  }
  if (state.step >= o.steps) await run.saveCheckpoint(model, state);
  return { steps: state.step, meanReward: rewardsByStep };
}
