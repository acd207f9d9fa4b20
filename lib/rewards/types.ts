/**
 * The shapes every reward component shares. A component is an async function of one finished
 * episode (`RewardContext`) that returns named values (`RewardParts`); combine.ts weights and sums
 * them. Values are numbers, or null when the component could not compute them (a judge that timed
 * out): the reason then goes in `errors`, so that a failure is logged and never passes for a zero.
 */
import type { ChatMessage } from '../model/tokenizer-types.js';

/** What the rewards may look at: the EpisodeRunner's episode (lib/episodes) has all of it. */
export interface RewardEpisode {
  /** Assistant turns generated. */
  turns?: number;
  /** Calls made to the environment (searches, sandbox tools). */
  calls?: readonly unknown[];
  /** The conversation, system prompt included (what the judge reads as the trajectory). */
  messages?: readonly ChatMessage[];
  /** Why the episode ended: `answer`, `max_turns`, `context`. */
  finish?: string;
}

export interface RewardContext {
  /** The episode's answer; null when it ended without one. */
  answer: string | null;
  /** Gold answers: matching any of them counts. */
  golds: readonly string[];
  question: string;
  /** The question's id, when the caller knows it (the trainers and evaluation pass it). */
  id?: string;
  episode?: RewardEpisode;
}

export interface RewardParts {
  /** Named values, logged as `reward/<name>`; null = could not be computed (see `errors`). */
  parts: Record<string, number | null>;
  /** Why a value is null or a component failed, keyed by the component (e.g. `judge`). */
  errors?: Record<string, string>;
  /** The component's verdict on correctness, where it has one (em, subem, the judge). */
  correct?: boolean;
}

export type RewardFn = (ctx: RewardContext) => Promise<RewardParts>;

/** What a reward returns for one episode, as the trainers read it (lib/rewards/combine.ts makes it). */
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
