/**
 * What an RL algorithm is to the rest of slm-train: one object, exported by the algorithm's own file
 * (lib/train/rl/grpo.ts, rloo.ts, ppo.ts, rft.ts) and listed in lib/train/rl/registry.ts. From it:
 *   - the config: `stage: NAME` and `algorithm.kind: NAME` are accepted, the keys it adds to the
 *     `algorithm` section (and its own top-level section, as RFT's `rft`) join the schema with their
 *     defaults, and validation (lib/config/load.ts) applies its rules — the group size it needs, where
 *     its KL goes and which estimators it takes, the loss normalisations it has, its own checks;
 *   - the run: `train` turns the resolved config into its options and runs it (most through the one
 *     RL loop, lib/train/rl/rl-loop.ts `runRl`, with the `RlAlgorithm` it creates).
 * Adding an algorithm is one file exporting one of these, plus its line in the registry (or
 * `registerAlgorithm` from outside, as test/algorithm-registry.test.ts does).
 */
import { schemaDefaults, sectionDefaults } from '../../config/schema.js';
import type { Schema } from '../../config/schema-kit.js';
import type { AlgorithmConfig, ResolvedConfig } from '../../config/types.js';
import type { Model } from '../../engine/model.js';
import type { RunFolder } from '../run.js';
import type { RlDeps } from '../types.js';
import { K1_LOSS_MESSAGE } from './gae.js';
import type { RlLoopOptions } from './rl-loop.js';

/** A problem with a config, at a dotted path (lib/config/problems.ts reports them all at once). */
export interface ConfigProblem {
  path: string[];
  message: string;
}

export type KlPlace = 'loss' | 'reward';
export type KlEstimatorName = 'k1' | 'k2' | 'k3';

/** What a stage hands the algorithm's `train`. */
export interface AlgorithmRun<Q> {
  model: Model;
  questions: Q[];
  run: RunFolder;
  deps: RlDeps<Q>;
  /** The loop's own options from the config (questions per step, steps, temperatures, seed, ...). */
  loop: RlLoopOptions & Record<string, unknown>;
  cfg: ResolvedConfig;
  log: (line: string) => void;
}

export interface AlgorithmDefinition {
  /** `stage: NAME` and `algorithm.kind: NAME`; also the metrics rows' stage. */
  name: string;
  /** One line: what it is (error messages, `slm-train train --help`). */
  summary: string;
  /** Keys it adds to the config's `algorithm` section: JSON Schema properties, each with its default. */
  algorithmKeys?: Record<string, Schema>;
  /** Its own top-level config section (`NAME:`), as JSON Schema properties with defaults. */
  section?: Record<string, Schema>;
  /** The fewest rollouts per question (rollout.k) it can learn from, and why (a group baseline: 2). */
  minGroupSize: number;
  groupReason?: string;
  /** Whether it has per-group rewards to filter and a plain policy-gradient update (dynamic sampling, old_logprobs: forward). */
  groupBaseline: boolean;
  /** algorithm.loss_norm values it implements. */
  lossNorms: readonly string[];
  /** Where its KL goes by default, and the estimators each place takes (a place it has not: absent). */
  kl: { defaultIn: KlPlace; loss?: readonly KlEstimatorName[]; reward?: readonly KlEstimatorName[] };
  /** Whether its loss takes the episodes' old log-probs (algorithm.old_logprobs); default true (RFT's SFT loss does not). */
  oldLogprobs?: boolean;
  /** Its own checks of a config whose stage it is (after the schema and the shared checks). */
  validate?(cfg: ResolvedConfig): ConfigProblem[];
  /** Runs the stage. */
  train<Q>(r: AlgorithmRun<Q>): Promise<{ steps: number; meanReward: number[]; lastLoss?: number }>;
}

/**
 * The KL settings' problem for an algorithm, or null: the place must be one it has, and the estimator
 * one that place takes (k1 in the loss only matters with a coefficient: its gradient is 0).
 */
export function klProblem(
  def: Pick<AlgorithmDefinition, 'name' | 'kl'>,
  place: KlPlace,
  estimator: KlEstimatorName,
  coef: number,
): ConfigProblem | null {
  const name = def.name.toUpperCase();
  // An algorithm with no KL term (RFT's SFT loss) ignores the KL settings, as before the registry.
  if (!def.kl.loss && !def.kl.reward) return null;
  const takes = def.kl[place];
  if (!takes)
    return coef > 0
      ? {
          path: ['algorithm', 'kl_in'],
          message: `${name} puts the KL in the ${def.kl.defaultIn}, found kl_in: ${place}; set kl_in: ${def.kl.defaultIn} (or kl_coef: 0)`,
        }
      : null;
  if (takes.includes(estimator)) return null;
  if (estimator === 'k1' && place === 'loss') return coef > 0 ? { path: ['algorithm', 'kl_estimator'], message: K1_LOSS_MESSAGE } : null;
  return {
    path: ['algorithm', 'kl_estimator'],
    message: `the KL term in the ${place} supports ${takes.join(' or ')}, found ${JSON.stringify(estimator)}${def.kl.reward?.includes(estimator) && place === 'loss' ? `; use ${estimator} with kl_in: reward` : ` (${name})`}`,
  };
}

/** The group-size problem for an algorithm, or null. */
export function groupSizeProblem(def: Pick<AlgorithmDefinition, 'name' | 'minGroupSize' | 'groupReason'>, k: number): ConfigProblem | null {
  if (Number.isInteger(k) && k >= def.minGroupSize) return null;
  return {
    path: ['rollout', 'k'],
    message: `${def.groupReason ?? `${def.name.toUpperCase()} samples rollout.k episodes per question`}: expected an integer >= ${def.minGroupSize}, found ${k}${def.minGroupSize > 1 ? `; set rollout.k to ${def.minGroupSize} or more (or use stage: sft or rft, which need no group)` : ''}`,
  };
}

/** algorithm.kl_in and kl_estimator where the config leaves them null: the algorithm's place, k1 in the reward, k3 in the loss. */
export function klDefaults(
  def: Pick<AlgorithmDefinition, 'kl'>,
  a: { kl_in: KlPlace | null; kl_estimator: KlEstimatorName | null },
): { klIn: KlPlace; klEstimator: KlEstimatorName } {
  const klIn = a.kl_in ?? def.kl.defaultIn;
  return { klIn, klEstimator: a.kl_estimator ?? (klIn === 'reward' ? 'k1' : 'k3') };
}

/**
 * The algorithm section's defaults as the schema gives them, the algorithm's own keys included even
 * when it is not registered (for trainers called with partial options, outside a config).
 */
export function algorithmDefaults(def: Pick<AlgorithmDefinition, 'algorithmKeys'>): AlgorithmConfig {
  return { ...sectionDefaults('algorithm'), ...(schemaDefaults({ properties: def.algorithmKeys ?? {} }) as object) };
}
