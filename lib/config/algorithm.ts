/** What a resolved config hands to the pure training functions (advantages, schedules). */
import type { GroupAdvantageOptions } from '../train/rl/advantages.js';
import type { PpoAdvantageOptions } from '../train/rl/gae.js';
import type { ScheduleSpec } from '../train/schedule.js';
import type { ResolvedConfig } from './types.js';

/**
 * GRPO group advantages as configured. With `fallbacks.fail_by: correct` the trainer passes each
 * reward's correctness flag as the `success` argument (`useCorrectness`); otherwise failure is
 * reward <= fail_at_or_below.
 */
export function groupAdvantageOptions(c: ResolvedConfig): GroupAdvantageOptions & { useCorrectness: boolean } {
  const a = c.algorithm;
  return {
    std: a.std,
    stdEstimator: a.std_estimator,
    eps: a.adv_eps,
    flatStd: a.fallbacks.flat_std,
    flatSkipBelow: a.fallbacks.flat_skip_below,
    failAtOrBelow: a.fallbacks.fail_at_or_below,
    allFailed: a.fallbacks.all_failed,
    zeroVariance: a.fallbacks.zero_variance,
    center: a.fallbacks.center,
    useCorrectness: a.fallbacks.fail_by === 'correct',
  };
}

/** PPO token rewards and GAE as configured; the KL penalty goes into the reward only with kl_in: reward. */
export function ppoAdvantageOptions(c: ResolvedConfig): PpoAdvantageOptions {
  const a = c.algorithm;
  return { gamma: a.gamma, lam: a.lam, klCoef: a.kl_in === 'reward' ? a.kl_coef : 0, klEstimator: a.kl_estimator, whiten: a.whiten };
}

/** The learning-rate schedule (lib/train/schedule.ts); totalSteps comes from the trainer when train.steps is null. */
export function scheduleSpec(c: ResolvedConfig, lr = c.optim.lr): ScheduleSpec {
  return { kind: c.optim.schedule, lr, warmupSteps: c.optim.warmup_steps, totalSteps: c.train.steps ?? undefined, minRatio: c.optim.min_lr_ratio };
}
