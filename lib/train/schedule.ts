/** Learning-rate schedules: a pure function of the step (0-based), as transformers' schedulers. */
import { SlmError } from '../errors.js';
import { sectionDefaults } from '../config/schema.js';

export interface ScheduleSpec {
  kind: 'constant' | 'linear' | 'cosine';
  lr: number;
  warmupSteps?: number;
  totalSteps?: number;
  /** Final lr as a fraction of lr (cosine and linear); default optim.min_lr_ratio's. */
  minRatio?: number;
}

export function learningRate(s: ScheduleSpec, step: number): number {
  const warm = s.warmupSteps ?? sectionDefaults('optim').warmup_steps;
  if (step < warm) return (s.lr * (step + 1)) / warm;
  if (s.kind === 'constant') return s.lr;
  const total = s.totalSteps;
  if (!total || total <= warm) throw new SlmError('CONFIG_INVALID', `a ${s.kind} schedule needs totalSteps greater than warmupSteps (${warm}), found ${total}.`);
  const progress = Math.min(1, (step - warm) / (total - warm));
  const min = s.minRatio ?? sectionDefaults('optim').min_lr_ratio;
  const f = s.kind === 'linear' ? 1 - progress : 0.5 * (1 + Math.cos(Math.PI * progress));
  return s.lr * (min + (1 - min) * f);
}
