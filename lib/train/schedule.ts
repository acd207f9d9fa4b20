/** Learning-rate schedules: a pure function of the step (0-based), as transformers' schedulers. */
import { SlmError } from '../errors.js';
import { sectionDefaults } from '../config/schema.js';
import type { OptimConfig, ResolvedConfig } from '../config/types.js';
import type { AdamOptions } from './types.js';

export interface ScheduleSpec {
  kind: 'constant' | 'linear' | 'cosine';
  lr: number;
  warmupSteps?: number;
  totalSteps?: number;
  /** Final lr as a fraction of lr (cosine and linear); default optim.min_lr_ratio's. */
  minRatio?: number;
}

export function learningRate(spec: ScheduleSpec, step: number): number {
  const warm = spec.warmupSteps ?? sectionDefaults('optim').warmup_steps;
  if (step < warm) return (spec.lr * (step + 1)) / warm;
  if (spec.kind === 'constant') return spec.lr;
  const total = spec.totalSteps;
  if (!total || total <= warm)
    throw new SlmError('CONFIG_INVALID', `a ${spec.kind} schedule needs totalSteps greater than warmupSteps (${warm}), found ${total}.`);
  const progress = Math.min(1, (step - warm) / (total - warm));
  const min = spec.minRatio ?? sectionDefaults('optim').min_lr_ratio;
  const f = spec.kind === 'linear' ? 1 - progress : 0.5 * (1 + Math.cos(Math.PI * progress));
  return spec.lr * (min + (1 - min) * f);
}

/** The learning-rate schedule of a config (optim); totalSteps comes from the trainer when train.steps is null. */
export function scheduleSpec(c: ResolvedConfig, lr = c.optim.lr): ScheduleSpec {
  return {
    kind: c.optim.schedule,
    lr,
    warmupSteps: c.optim.warmup_steps,
    totalSteps: c.train.steps ?? undefined,
    minRatio: c.optim.min_lr_ratio,
  };
}

/** The optimizer's settings of the optim section, as every trainer takes them. */
export function optimizerOptions(optim: OptimConfig): {
  weightDecay: number;
  maxGradNorm: number;
  adam: AdamOptions;
  microBatch: number | undefined;
  gradientCheckpointing: boolean;
} {
  return {
    weightDecay: optim.weight_decay,
    maxGradNorm: optim.max_grad_norm,
    adam: { beta1: optim.betas[0], beta2: optim.betas[1], eps: optim.eps },
    microBatch: optim.micro_batch || undefined,
    gradientCheckpointing: optim.gradient_checkpointing,
  };
}
