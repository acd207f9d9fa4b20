/**
 * The types the RL trainers share with their callers (the session, the reward composer, the
 * data-parallel gather): what an episode carries into training, what a reward returns, how rollouts
 * are requested. Types only: every module may import this one without creating a cycle.
 */

/** What the trainer needs of an episode (the EpisodeRunner returns more). */
export interface TrainEpisode {
  ids: Int32Array;
  /** 1 on model-generated tokens only. */
  lossMask: Uint8Array;
  /** Sampling log-probs aligned with ids (0 where the mask is 0, and on prefilled tokens). */
  logprobs: Float32Array;
  /** 1 on tokens the runner prefilled (protocol.prefill_*), which the sampler gave no log-prob; absent when none. */
  forced?: Uint8Array;
  temperature: number;
  /** The temperature the loss scores this episode at when it is not `temperature` (algorithm.loss_temperature). */
  lossTemperature?: number;
  answer: string | null;
  turns: number;
  /** Anything worth saving in the trajectories file (messages, calls, finish reason...). */
  record?: Record<string, unknown>;
}

export interface RolloutRequest<Q> {
  question: Q;
  temperature: number;
  /** Drawn per rollout when the config gives a top-p range; else the runner's top-p applies. */
  topP?: number;
  seed: number;
}

export interface RewardResult {
  total: number;
  parts: Record<string, number | null>;
  correct?: boolean;
  /** Why a part is null (a failed judge call...), by part name. */
  errors?: Record<string, string>;
  /**
   * True when a reward component failed (a judge call that errored or gave an unparseable reply):
   * `total` then holds the configured penalty (reward.failure_value) and `errors` says why. Absent
   * when every component worked.
   */
  failed?: boolean;
  /**
   * reward.on_failure: exclude — the trainers leave this episode out of the loss (and out of its
   * group's statistics) and count it (episodes_excluded).
   */
  excluded?: boolean;
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
