/**
 * RLOO, REINFORCE with a leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, "Back to
 * Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs"): per
 * group (one question's K rollouts), each rollout's baseline is the mean reward of the others,
 *   A_i = r_i - (1 / (K - 1)) sum_{j != i} r_j  (= K / (K - 1) (r_i - mean r)),
 * with no std normalisation. The update is GRPO's (lib/train/rl/grpo.ts `groupPolicyGradient`): the
 * clipped policy gradient against the sampling log-probs, which with one inner epoch is REINFORCE's
 * gradient (the ratio is 1), token- or sequence-level as algorithm.loss_norm says.
 * An episode excluded by its reward (reward.on_failure: exclude) leaves its group: the baseline is
 * over the members that remain, and a group with fewer than two is skipped ('single_rollout').
 */
import type { Model } from '../../engine/model.js';
import { SlmError } from '../../errors.js';
import { groupSizeProblem, type AlgorithmDefinition } from './algorithm.js';
import { groupPolicyGradient, pgOptionsFrom, PG_KL, type PgOptions } from './grpo.js';
import { runRl } from './rl-loop.js';
import type { RunFolder } from '../run.js';
import type { RlDeps } from '../types.js';

/** One group's leave-one-out advantages, or null (with the reason) when it has no baseline to give. */
export function rlooAdvantages(rewards: readonly number[]): { advantages: number[] | null; reason?: string } {
  const K = rewards.length;
  if (K < 2) return { advantages: null, reason: 'single_rollout' };
  if (rewards.some((x) => !Number.isFinite(x))) return { advantages: null, reason: 'non_finite_reward' };
  const sum = rewards.reduce((a, b) => a + b, 0);
  return { advantages: rewards.map((r) => r - (sum - r) / (K - 1)) };
}

export async function runRloo<Q>(
  model: Model,
  questions: Q[],
  run: RunFolder,
  deps: RlDeps<Q>,
  o: PgOptions,
): Promise<{ steps: number; meanReward: number[] }> {
  const k = groupSizeProblem(rloo, o.k);
  if (k) throw new SlmError('CONFIG_INVALID', `${k.message}.`, { path: k.path.join('.') });
  return runRl(model, questions, run, deps, groupPolicyGradient<Q>('rloo', rlooAdvantages, o), o);
}

/** RLOO in the registry (lib/train/rl/registry.ts): no keys of its own (GRPO's update, its own baseline). */
export const rloo: AlgorithmDefinition = {
  name: 'rloo',
  summary: "RLOO: each rollout's baseline is the mean reward of its group's other rollouts (no std); GRPO's clipped policy-gradient update",
  minGroupSize: 2,
  groupReason: "RLOO's baseline for a rollout is the mean reward of its group's other rollouts",
  groupBaseline: true,
  lossNorms: ['token', 'sequence', 'turn'],
  kl: PG_KL,
  train: (r) => runRloo(r.model, r.questions, r.run, r.deps, { ...r.loop, ...pgOptionsFrom(r.cfg) }),
};
