/**
 * PPO over real episodes, as Search-R1 runs it on verl, as an algorithm of the RL loop
 * (lib/train/rl/rl-loop.ts: steps 1, 2 and 6 are the loop's; the forward passes, GAE assembly and
 * mini-batch updates are in lib/train/rl/ppo-batch.ts). One step:
 *   1. take the next questions (seeded order, resumable), `n` rollouts each (PPO needs no group: 1
 *      is enough), every rollout with its own temperature drawn from the configured range;
 *   2. score every episode (each reward part kept for the logs);
 *   3. the critic's values on every trained token (the value head on the hidden states of the critic's
 *      forward: the separate critic's adapter, or with `critic: 'shared'` the policy's own), the
 *      reference log-probs (adapter off) when the KL penalty is on, and the old log-probs (the
 *      sampling log-probs, or a fresh forward with `recomputeOldLogprobs`);
 *   4. token rewards (score on the last trained token, -kl_coef * KL on every trained token when the KL
 *      goes into the reward), GAE over the trained tokens only (masked environment text is skipped),
 *      advantages whitened over the batch (lib/train/rl/advantages.ts `ppoAdvantages`);
 *   5. `ppoEpochs` passes over the episodes in seeded mini-batches, one optimizer step each (one native
 *      call), token-mean over the mini-batch's trained tokens: with a separate critic (Search-R1's) the
 *      clipped policy loss against the old log-probs trains the actor's adapter, and the clipped value
 *      loss alone trains the critic's adapter and value head, each clipped and stepped apart (the
 *      critic at its own rate and clip); with a shared critic, policy loss + vf_coef * value loss
 *      train the one adapter and the head (the head at its own rate) under one clip;
 *   6. metrics row, trajectories JSONL, checkpoints (adapter, value head, critic adapter, optimizers,
 *      data position).
 * How this departs from verl's PPO:
 *   - the separate critic is a LoRA adapter + value head on the actor's frozen base, not a second
 *     full model (it starts as a copy of the actor's adapter, as verl's critic starts from the
 *     actor's model; the head is fresh, as verl's token-classification head is);
 *   - values are read through Model.values: one native forward (the critic's adapter), dropout off (the
 *     training forward samples LoRA dropout, so with dropout > 0 the loss sees slightly different
 *     values, as verl's critic in train mode does);
 *   - the value clip fraction and the old/new policy KL (verl actor/ppo_kl) are not reported (the
 *     native step does not count them; the mean ratio is);
 *   - LoRA on a frozen base rather than full fine-tuning (Search-R1 updates every weight).
 * The native loss weighs masked tokens by 0 rather than dropping them: the per-token arrays must hold
 * finite, moderate values there (ppoPrepare writes 0), or an overflow would make the loss NaN and
 * skip the step.
 */
import type { Model } from '../../engine/model.js';
import type { NativeTrainStats } from '../../binding/types.js';
import { SlmError } from '../../errors.js';
import type { KlEstimator, PpoAdvantageOptions, PpoAdvantages } from './gae.js';
import {
  gatherForward,
  ppoAdvantagesFor,
  ppoForward,
  ppoUpdate,
  type PpoBatch,
  type PpoPrepareOptions,
  type PpoStepInfo,
} from './ppo-batch.js';
import { runRl, stageLearningRate, type RlAlgorithm, type RlLoopOptions, type StageSchedule } from './rl-loop.js';
import type { RunFolder } from '../run.js';
import { mean } from './rollout-metrics.js';
import { sectionDefaults } from '../../config/schema.js';
import { bool, int, num, oneOf } from '../../config/schema-kit.js';
import type { AlgorithmConfig, ResolvedConfig } from '../../config/types.js';
import { stripUndefined } from '../../util/objects.js';
import { optimizerOptions, scheduleSpec } from '../schedule.js';
import { algorithmDefaults, klDefaults, klProblem, type AlgorithmDefinition, type ConfigProblem } from './algorithm.js';
import type { Shard } from '../../distributed/run.js';
import type { AdamOptions, RlDeps } from '../types.js';

export interface PpoOptions extends RlLoopOptions {
  /** Rollouts per question (rollout.k; PPO needs no group: 1 is enough). */
  n: number;
  /** Passes over a step's episodes (verl ppo_epochs; algorithm.inner_epochs). */
  ppoEpochs?: number;
  /** Episodes per optimizer step (verl ppo_mini_batch_size); default: all of the step's episodes. */
  miniBatch?: number;
  clipLow?: number;
  /** Default: clipLow. */
  clipHigh?: number;
  /** GAE discount and lambda (Search-R1: 1 and 1). */
  gamma?: number;
  lam?: number;
  /** Whiten the advantages over the batch's trained tokens (verl does). */
  whiten?: boolean;
  /** KL to the reference (see klReference); Search-R1 uses 0.001. */
  klCoef?: number;
  /** 'reward' (default, verl's kl_ctrl in the token rewards) or 'loss' (a KL term in the native loss). */
  klIn?: 'reward' | 'loss';
  /** k1 by default; the loss takes k3 (k1 there is refused: its expected gradient is 0), the reward k1, k2 and k3. */
  klEstimator?: KlEstimator;
  /**
   * The critic: 'separate' (Search-R1's: a second adapter + value head on the same frozen base, its own
   * optimizer, rate and clip) or 'shared' (default: the value head on the actor's adapter, one clip).
   */
  critic?: 'shared' | 'separate';
  /** The separate critic's gradient clip (Search-R1: 1.0); default: maxGradNorm. */
  criticMaxGradNorm?: number;
  /** Value-loss coefficient (shared critic; a separate one trains on the value loss alone) and clip range around the old values. */
  vfCoef?: number;
  valueClip?: number;
  entropyCoef?: number;
  /** Token-mean over the mini-batch (verl's token-mean); false: per-sequence means. */
  tokenLevel?: boolean;
  /** The actor's (LoRA) learning-rate schedule. */
  schedule: StageSchedule;
  /** The critic's (value head) schedule; default: the actor's with `criticLr` (or the actor's lr). */
  criticSchedule?: StageSchedule;
  criticLr?: number;
  /** First steps that train only the critic (verl trainer.critic_warmup; default none). */
  criticWarmup?: number;
  /** Old log-probs from a forward pass before the update instead of the sampling log-probs. */
  recomputeOldLogprobs?: boolean;
  weightDecay?: number;
  maxGradNorm?: number;
  adam?: AdamOptions;
  microBatch?: number;
  gradientCheckpointing?: boolean;
  /**
   * Data-parallel rank (lib/distributed): this process rolls out its share of each step's questions
   * and computes their values and log-probs; the prepared episodes are gathered so that every rank
   * computes the same advantages (whitening over the global batch) and walks the same mini-batches,
   * training on the members it rolled out (the model's trainStep all-reduces the gradients).
   */
  shard?: Shard;
  /** Sees every step's prepared batch before the update (tests, debugging). */
  onBatch?: (info: PpoStepInfo) => void | Promise<void>;
}

/** PPO's KL: in the reward by default (Search-R1), any estimator there; k3 in the loss. */
const ppoDefinitionKl = { kl: { defaultIn: 'reward', reward: ['k1', 'k2', 'k3'], loss: ['k3'] } } as const;

/** PPO's settings of an algorithm section (the config's, or the schema's defaults). */
function ppoSettings(algorithm: AlgorithmConfig) {
  const { klIn, klEstimator } = klDefaults(ppoDefinitionKl, algorithm);
  return {
    ppoEpochs: algorithm.inner_epochs,
    miniBatch: algorithm.mini_batch || undefined,
    clipLow: algorithm.clip_low,
    clipHigh: algorithm.clip_high ?? algorithm.clip_low,
    gamma: algorithm.gamma,
    lam: algorithm.lam,
    whiten: algorithm.whiten,
    klCoef: algorithm.kl_coef,
    klIn,
    klEstimator,
    entropyCoef: algorithm.entropy_coef,
    tokenLevel: algorithm.loss_norm === 'token',
    vfCoef: algorithm.vf_coef,
    valueClip: algorithm.value_clip,
    critic: algorithm.critic,
  };
}

/** PPO token rewards and GAE as configured; the KL penalty goes into the reward only with kl_in: reward. */
export function ppoAdvantageOptions(c: ResolvedConfig): PpoAdvantageOptions {
  const a = c.algorithm;
  return { gamma: a.gamma, lam: a.lam, klCoef: a.kl_in === 'reward' ? a.kl_coef : 0, klEstimator: a.kl_estimator, whiten: a.whiten };
}

/**
 * PPO's options from a resolved config's algorithm, rollout and optim sections; the loop's own options
 * (questions per step, steps, seed...) come from the caller.
 */
export function ppoOptionsFrom(cfg: ResolvedConfig): Omit<PpoOptions, keyof RlLoopOptions> {
  return {
    n: cfg.rollout.k,
    ...ppoSettings(cfg.algorithm),
    ...(cfg.optim.critic_max_grad_norm !== null ? { criticMaxGradNorm: cfg.optim.critic_max_grad_norm } : {}),
    schedule: scheduleSpec(cfg),
    criticLr: cfg.optim.critic_lr,
    // optim.critic_warmup_steps: the critic's own warm-up (Search-R1: 0.015 of the steps, the actor 0.285).
    ...(cfg.optim.critic_warmup_steps !== null
      ? { criticSchedule: { ...scheduleSpec(cfg, cfg.optim.critic_lr), warmupSteps: cfg.optim.critic_warmup_steps } }
      : {}),
  };
}

/** Mean and (population) variance over the entries where the mask is 1. */
function maskedStats(xs: Float32Array[], masks: Uint8Array[]): { mean: number; var: number; n: number } {
  let n = 0;
  let s = 0;
  xs.forEach((x, i) =>
    x.forEach((v, t) => {
      if (!masks[i][t]) return;
      n++;
      s += v;
    }),
  );
  const m = n ? s / n : NaN;
  let ss = 0;
  xs.forEach((x, i) => x.forEach((v, t) => masks[i][t] && (ss += (v - m) ** 2)));
  return { mean: m, var: n ? ss / n : NaN, n };
}

/** What PPO's advantages phase hands to its update and its metrics row. */
interface PpoStep {
  prep: { kept: number[]; batch: PpoBatch; adv: PpoAdvantages; refLogprobs?: Float32Array[] };
  /** Whether this step trains only the critic (criticWarmup). */
  warm: boolean;
}

/** PPO as an algorithm of the RL loop; throws CONFIG_INVALID for options that cannot work together. */
function ppo<Q>(opts: PpoOptions): RlAlgorithm<Q, PpoStep, NativeTrainStats[]> {
  // What the caller left out: the schema's defaults, through the same mapping as a config's.
  const p = { ...optimizerOptions(sectionDefaults('optim')), ...ppoSettings(algorithmDefaults(ppoDefinition)), ...stripUndefined(opts) };
  const n = opts.n;
  const kl = klProblem(ppoDefinition, p.klIn, p.klEstimator, p.klCoef);
  if (kl) throw new SlmError('CONFIG_INVALID', `${kl.message}.`, { path: kl.path.join('.') });
  if (!Number.isInteger(n) || n < 1)
    throw new SlmError('CONFIG_INVALID', `n (rollouts per question) must be a positive integer, found ${n}.`);
  const separate = p.critic === 'separate';
  const criticBase = opts.criticSchedule ?? (opts.criticLr !== undefined ? { ...opts.schedule, lr: opts.criticLr } : undefined);
  const { klCoef, klIn, klEstimator } = p;
  const checkpoint = p.gradientCheckpointing;
  const prepOpts: PpoPrepareOptions = {
    gamma: p.gamma,
    lam: p.lam,
    whiten: p.whiten,
    klCoef,
    klIn,
    klEstimator,
    recomputeOldLogprobs: opts.recomputeOldLogprobs ?? false,
    checkpoint,
  };
  const lrs = (step: number) => {
    const lr = stageLearningRate(opts.schedule, opts.steps, step);
    return { lr, valueLr: criticBase ? stageLearningRate(criticBase, opts.steps, step) : lr, warm: step < (opts.criticWarmup ?? 0) };
  };
  return {
    name: 'ppo',
    groupSize: n,
    prepare: { timer: 'time_prepare_s', detail: 'values and advantages' },
    begin(model, b) {
      if (b.resume) {
        if (!model.hasValueHead())
          throw new SlmError(
            'CHECKPOINT_INVALID',
            `--resume: the latest checkpoint in ${b.dir} has no value head (value_head.safetensors); it is not a PPO checkpoint.`,
          );
        if (model.hasCritic() !== separate)
          throw new SlmError(
            'CONFIG_INVALID',
            `--resume: the latest checkpoint in ${b.dir} was trained with ${model.hasCritic() ? 'a separate critic (critic_adapter.safetensors)' : "the critic sharing the actor's adapter (no critic_adapter.safetensors)"}, but algorithm.critic is ${separate ? 'separate' : 'shared'}. Resume with the critic the run started with (algorithm.critic: ${model.hasCritic() ? 'separate' : 'shared'}), or start a new run.`,
            { path: 'algorithm.critic' },
          );
        return;
      }
      if (b.fresh || !model.hasValueHead()) model.attachValueHead(opts.seed + 1);
      // The separate critic starts from the actor's starting adapter (Search-R1: critic.model.path is
      // the actor's); one loaded with the starting adapter (a PPO result) is kept, unless this stage
      // starts fresh.
      if (separate && (b.fresh || !model.hasCritic())) model.attachCritic();
      else if (!separate && model.hasCritic()) model.detachCritic();
    },
    // Steps 3-4: values, reference, advantages.
    async advantages(rlStep) {
      const scores = rlStep.rewards.map((r) => r.total);
      // Each rank's forward passes cover its own episodes; the advantages (whitened over the whole
      // batch) are computed from every rank's, identically on every rank.
      // reward.on_failure: exclude — an episode whose reward failed trains nothing (no trained token).
      const trained = rlStep.episodes.map((e, i) =>
        rlStep.rewards[i].excluded === true ? { ...e, lossMask: new Uint8Array(e.lossMask.length) } : e,
      );
      const fwd = await ppoForward(rlStep.model, trained, prepOpts);
      const global = rlStep.shard ? await gatherForward(rlStep.shard, fwd, rlStep.offset, scores) : { forward: fwd, scores };
      const prep = ppoAdvantagesFor(global.forward, global.scores, prepOpts);
      await opts.onBatch?.({
        step: rlStep.step + 1,
        episodes: rlStep.episodes,
        kept: prep.kept,
        scores,
        refLogprobs: prep.refLogprobs,
        adv: prep.adv,
        batch: prep.batch,
      });
      return { prep, warm: lrs(rlStep.step).warm };
    },
    trained: (a) => a.prep.kept.length,
    // Step 5: the update (the critic alone during its warm-up).
    async update(rlStep, { prep, warm }) {
      if (!prep.kept.length) return [];
      const { lr, valueLr } = lrs(rlStep.step);
      const b = warm ? { ...prep.batch, advantages: prep.batch.advantages.map((a) => new Float32Array(a.length)) } : prep.batch;
      return ppoUpdate(rlStep.model, b, {
        epochs: p.ppoEpochs,
        miniBatch: p.miniBatch,
        seed: opts.seed * 31 + rlStep.step,
        lr: warm ? 0 : lr,
        valueLr,
        clipLow: p.clipLow,
        clipHigh: p.clipHigh,
        klCoef: klIn === 'loss' && !warm ? klCoef : 0,
        klEstimator: klEstimator === 'k3' ? 'k3' : 'k1',
        entropyCoef: warm ? 0 : p.entropyCoef,
        vfCoef: p.vfCoef,
        valueClip: p.valueClip,
        tokenLevel: p.tokenLevel,
        weightDecay: p.weightDecay,
        maxGradNorm: p.maxGradNorm,
        criticMaxGradNorm: opts.criticMaxGradNorm,
        adam: p.adam,
        microBatch: p.microBatch,
        checkpoint,
        mine: rlStep.shard ? (i) => prep.kept[i] >= rlStep.offset && prep.kept[i] < rlStep.offset + rlStep.episodes.length : undefined,
      });
    },
    // The value and return at the episode's first trained token.
    trajectory(s, { prep }, i) {
      const j = prep.kept.indexOf(s.offset + i);
      const f = j < 0 ? -1 : prep.batch.masks[j].indexOf(1);
      return { value: f >= 0 ? prep.batch.oldValues[j][f] : null, return: f >= 0 ? prep.adv.returns[j][f] : null };
    },
    share: () => null,
    row(rlStep, { prep, warm }, stats, all) {
      const { lr, valueLr } = lrs(rlStep.step);
      const done = stats.filter((x) => !x.skipped);
      const sm = (k: keyof NativeTrainStats) => (done.length ? mean(done.map((x) => x[k] as number)) : undefined);
      const { masks, oldValues } = prep.batch;
      const v = maskedStats(oldValues, masks);
      const ret = maskedStats(prep.adv.returns, masks);
      const resid = maskedStats(
        prep.adv.returns.map((r, i) => r.map((x, t) => x - oldValues[i][t])),
        masks,
      );
      const advStats = maskedStats(prep.adv.advantages, masks);
      const excluded = all.rewards.filter((r) => r.excluded === true).length;
      return {
        head: { lr: warm ? 0 : lr, critic_lr: valueLr, critic_warmup: warm || undefined },
        body: {
          episodes_trained: prep.kept.length,
          episodes_excluded: excluded || undefined,
          episodes_empty: all.episodes.length - prep.kept.length - excluded || undefined,
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
          critic_grad_norm: separate ? sm('criticGradNorm') : undefined,
          optimizer_steps: done.length,
          updates_skipped: stats.length - done.length || undefined,
        },
      };
    },
  };
}

export async function runPpo<Q>(
  model: Model,
  questions: Q[],
  run: RunFolder,
  deps: RlDeps<Q>,
  o: PpoOptions,
): Promise<{ steps: number; meanReward: number[] }> {
  return runRl(model, questions, run, deps, ppo<Q>(o), o);
}

/** PPO in the registry (lib/train/rl/registry.ts): its keys of the algorithm section are GAE's and the critic's. */
export const ppoDefinition: AlgorithmDefinition = {
  name: 'ppo',
  summary:
    'PPO as Search-R1 runs it on verl: a critic (value head, shared or a separate adapter), GAE over the trained tokens, clipped policy and value losses in mini-batches',
  algorithmKeys: {
    gamma: num(1, { minimum: 0, maximum: 1 }),
    lam: num(1, { minimum: 0, maximum: 1 }),
    vf_coef: num(
      0.5,
      { minimum: 0 },
      "PPO: the value loss's weight in the shared critic's joint loss (critic: shared); a separate critic trains on the value loss alone (verl's dp_critic), so there vf_coef > 0 only switches it on",
    ),
    critic: oneOf(
      ['shared', 'separate'],
      'shared',
      "PPO's critic: shared = a value head on the actor's own LoRA'd trunk (the value loss also trains the actor's adapter, at the actor's rate, and one gradient clip covers both); separate = a second LoRA adapter + the value head on the same frozen base weights (not a second copy of them), starting as a copy of the actor's adapter, trained on the value loss alone by its own AdamW at optim.critic_lr and clipped to optim.critic_max_grad_norm, as Search-R1's critic is a model apart",
    ),
    value_clip: num(0.5, { exclusiveMinimum: 0 }),
    whiten: bool(true, 'whiten PPO advantages over the batch (verl)'),
    mini_batch: int(
      0,
      { minimum: 0 },
      "PPO: episodes per optimizer step (verl ppo_mini_batch_size; Search-R1: half the batch); 0 = all of the step's episodes",
    ),
  },
  minGroupSize: 1,
  groupBaseline: false,
  lossNorms: ['token', 'sequence'],
  kl: ppoDefinitionKl.kl,
  validate(cfg) {
    const p: ConfigProblem[] = [];
    if (cfg.algorithm.critic === 'separate' && cfg.algorithm.vf_coef === 0)
      p.push({
        path: ['algorithm', 'vf_coef'],
        message:
          'a separate critic trains on the value loss alone, and vf_coef 0 switches the value loss off: its values would never be trained. Set vf_coef > 0 (its size does not matter there) or critic: shared',
      });
    return p;
  },
  train(r) {
    const o: PpoOptions = { ...r.loop, ...ppoOptionsFrom(r.cfg) };
    return runRl(r.model, r.questions, r.run, r.deps, ppo(o), o);
  },
};
