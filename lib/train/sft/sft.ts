/**
 * SFT: LoRA on assistant tokens only, epochs over length-sorted batches taken in a seeded order,
 * one native call per optimizer step, metrics every step, atomic checkpoints, exact resume.
 */
import type { Model } from '../../engine/model.js';
import { SlmError } from '../../errors.js';
import type { LoraSpec } from '../../engine/adapter.js';
import { Progress, type ProgressTo } from '../../util/progress.js';
import { learningRate, type ScheduleSpec } from '../schedule.js';
import { permutation, type RunFolder, type TrainState } from '../run.js';
import { batchByLength, type SftExample } from './sft-data.js';
import type { AdamOptions } from '../types.js';
import { sectionDefaults } from '../../config/schema.js';
import { shardRange } from '../../distributed/data-parallel.js';
import type { Shard } from '../../distributed/run.js';

export interface SftOptions {
  lora: LoraSpec;
  epochs: number;
  /** Stop after this many optimizer steps in all (the config's train.steps); default: every epoch. */
  maxSteps?: number;
  batchSize: number;
  microBatch?: number;
  maxBatchTokens?: number;
  schedule: Omit<ScheduleSpec, 'totalSteps'> & { totalSteps?: number };
  weightDecay?: number;
  maxGradNorm?: number;
  /** AdamW's betas and eps (optim.betas, optim.eps); default 0.9, 0.999, 1e-8. */
  adam?: AdamOptions;
  gradientCheckpointing?: boolean;
  seed: number;
  checkpointEvery?: number;
  /** Stop after this many optimizer steps in this process (tests of resume). */
  stopAfter?: number;
  resume?: boolean;
  /** Called after each step's metrics row (awaited: e.g. an evaluation every N steps). */
  onStep?: (row: Record<string, unknown>) => void | Promise<void>;
  /** Where the steps' progress bar goes (default: none). */
  progress?: ProgressTo;
  /** Data-parallel rank (lib/distributed): this process trains its share of each batch. */
  shard?: Shard;
}

/** What one SFT optimizer step takes of the trainer's options. */
export type SftStepOptions = Pick<
  SftOptions,
  'weightDecay' | 'maxGradNorm' | 'adam' | 'microBatch' | 'gradientCheckpointing' | 'seed' | 'shard'
>;

/**
 * One optimizer step of the SFT loss (next-token NLL on the masked tokens) on `batch` (this rank's
 * share of it), and its metrics row: `stage`, `step` (the step after it: at.step + 1), loss, tokens.
 * SFT runs it over the conversations of data.sft, RFT (lib/train/rl/rft.ts) over its kept episodes.
 */
export async function sftStep(
  model: Model,
  batch: SftExample[],
  at: { stage: string; step: number; epoch: number; lr: number },
  opts: SftStepOptions,
): Promise<{ loss: number; row: Record<string, unknown> }> {
  const optim = sectionDefaults('optim');
  const t0 = performance.now();
  const mine = opts.shard ? batch.slice(...shardRange(batch.length, opts.shard.rank, opts.shard.world)) : batch;
  const s = await model.trainStep(
    { sequences: mine.map((e) => e.ids), masks: mine.map((e) => e.mask) },
    {
      loss: 'sft',
      lr: at.lr,
      weightDecay: opts.weightDecay ?? optim.weight_decay,
      maxGradNorm: opts.maxGradNorm ?? optim.max_grad_norm,
      ...opts.adam,
      microBatch: opts.microBatch,
      checkpoint: opts.gradientCheckpointing ?? optim.gradient_checkpointing,
      seed: opts.seed * 1000003 + at.step /* LoRA dropout: reproducible per step */,
    },
  );
  const masked = batch.reduce((a, e) => a + e.mask.length, 0);
  const tTrain = (performance.now() - t0) / 1e3;
  const row = {
    stage: at.stage,
    step: at.step + 1,
    epoch: at.epoch,
    lr: at.lr,
    loss: s.loss,
    grad_norm: s.gradNorm,
    sequences: batch.length,
    sequence_tokens_mean: masked / batch.length,
    tokens_trained: s.tokens,
    mask_coverage: s.tokens / masked,
    tokens_per_s: masked / tTrain,
    skipped: s.skipped || undefined,
    skip_reason: s.skipReason || undefined,
    time_train_s: tTrain,
  };
  return { loss: s.loss, row };
}

export async function runSft(
  model: Model,
  examples: SftExample[],
  run: RunFolder,
  opts: SftOptions,
): Promise<{ steps: number; lastLoss: number }> {
  if (!examples.length) throw new SlmError('DATA_INVALID', 'SFT has no examples to train on.');
  const batches = batchByLength(examples, opts.batchSize, opts.maxBatchTokens);
  const total = Math.min(batches.length * opts.epochs, opts.maxSteps ?? Infinity);
  const schedule: ScheduleSpec = { ...opts.schedule, totalSteps: opts.schedule.totalSteps ?? total };
  let state: TrainState = { step: 0, epoch: 0, batchInEpoch: 0, seed: opts.seed };
  run.schedule = schedule;
  if (opts.resume) state = await run.restore(model);
  else model.attachLora(opts.lora, opts.seed);
  let lastLoss = NaN;
  let ranHere = 0;
  const bar = new Progress('sft', total, 'steps', opts.progress, state.step);
  try {
    outer: for (let epoch = state.epoch; epoch < opts.epochs; epoch++) {
      const order = permutation(batches.length, opts.seed, epoch);
      for (let b = epoch === state.epoch ? state.batchInEpoch : 0; b < batches.length; b++) {
        if (opts.stopAfter !== undefined && ranHere >= opts.stopAfter) return { steps: state.step, lastLoss };
        if (state.step >= total) break outer;
        const batch = batches[order[b]];
        const lr = learningRate(schedule, state.step);
        const { loss, row } = await sftStep(model, batch, { stage: 'sft', step: state.step, epoch, lr }, opts);
        lastLoss = loss;
        state = {
          ...state,
          step: state.step + 1,
          epoch: b + 1 < batches.length ? epoch : epoch + 1,
          batchInEpoch: b + 1 < batches.length ? b + 1 : 0,
        };
        ranHere++;
        run.logMetrics(row);
        bar.update(state.step, { detail: `loss ${loss.toFixed(4)}` });
        await opts.onStep?.(row);
        if (opts.checkpointEvery && state.step % opts.checkpointEvery === 0) await run.saveCheckpoint(model, state);
      }
    }
  } finally {
    bar.stop();
  }
  await run.saveCheckpoint(model, state);
  return { steps: state.step, lastLoss };
}
