/**
 * The types the RL trainers share with their callers (the session, the reward composer, the
 * data-parallel gather): what an episode carries into training, what a reward returns, how rollouts
 * are requested (an episode's and a reward's shapes live with the episodes and the rewards). Types
 * only: every module may import this one without creating a cycle.
 */

export type { TrainEpisode } from '../episodes/runner-types.js';
export type { RewardResult } from '../rewards/types.js';
import type { TrainEpisode } from '../episodes/runner-types.js';
import type { RewardResult } from '../rewards/types.js';

export interface RolloutRequest<Q> {
  question: Q;
  temperature: number;
  /** Drawn per rollout when the config gives a top-p range; else the runner's top-p applies. */
  topP?: number;
  seed: number;
}

/** Rollouts of a batch; `onProgress` (when given) hears how many episodes have finished. */
export type RolloutFn<Q> = (batch: RolloutRequest<Q>[], onProgress?: (finished: number, total: number) => void) => Promise<TrainEpisode[]>;

/** What every RL trainer needs from its environment: rollouts and their rewards. */
export interface RlDeps<Q> {
  rollout: RolloutFn<Q>;
  reward(ep: TrainEpisode, q: Q): Promise<RewardResult>;
}

/**
 * Per group (one question's rollouts, excluded ones left out; their correctness flags when the
 * rewards give them): advantages, or null to skip the group, with a reason.
 */
export type GroupAdvantageFn = (rewards: number[], correct?: boolean[]) => { advantages: number[] | null; reason?: string };

/** AdamW's moment decay rates and epsilon, as the native trainStep takes them. */
export interface AdamOptions {
  beta1: number;
  beta2: number;
  eps: number;
}
