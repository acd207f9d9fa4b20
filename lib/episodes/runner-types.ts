/**
 * The EpisodeRunner's public types: its options (and the tokenizer and prompt formatter it needs),
 * what it is asked to run (EpisodeRequest), and what it returns: each Episode with its turns
 * (TurnRecord) and sequence pieces (Segment), and the batch's stats.
 */
import type { TextGenerator } from '../engine/types.js';
import type { ChatMessage, Tokenizer } from '../model/tokenizer-types.js';
import type { EpisodeCall, EpisodeProtocol, FinishReason, ProgramSummary, TurnAction } from './protocol.js';

/** What the runner needs to build prompts (lib/model/chat.ts's ChatFormatter has it). */
export interface PromptFormatter {
  /** The prompt for the first assistant turn (generation prompt included). */
  prompt(messages: readonly ChatMessage[], opts?: { enableThinking?: boolean }): string;
  /**
   * The exact text to append after the assistant's generated text (`history` ends with it, as
   * decoded, stop token text included) so that the sequence becomes the prompt for the next turn.
   */
  continuation(
    history: readonly ChatMessage[],
    next: readonly ChatMessage[],
    opts?: { strict?: boolean; enableThinking?: boolean },
  ): string;
}

export type RunnerTokenizer = Pick<Tokenizer, 'encode' | 'decode' | 'stopTokenIds' | 'specialTokens'>;

export interface EpisodeRunnerOptions {
  generator: TextGenerator;
  tokenizer: RunnerTokenizer;
  formatter: PromptFormatter;
  protocol: EpisodeProtocol;
  /**
   * Turns per episode, counted as the protocol says (EpisodeProtocol.turnsCount): assistant turns,
   * the answer turn included (`generations`, the default), or turns that get a reply, the final
   * answer turn not included (`searches`, Search-R1's max_turns). The last turn must answer.
   */
  maxTurns: number;
  /** Tokens one turn may generate. */
  maxNewTokens: number;
  /** Limit on an episode's whole sequence (prompt + every turn + every reply). */
  maxTotalTokens: number;
  /** Default temperature of episodes that do not set one (default 1). */
  temperature?: number;
  topP?: number;
  topK?: number;
  /** Base seed; each generate call gets a seed derived from it, the turn and the round. */
  seed?: number;
  /**
   * Require the chat template to render earlier turns unchanged when a message is added (see
   * ChatFormatter.continuation). Default false: the generated tokens stay as generated and the
   * template's text after the turn is appended, even where the template would re-render history.
   */
  strictTemplate?: boolean;
  /**
   * The chat template's `enable_thinking` (Qwen3's hybrid templates: false pre-fills an empty
   * `<think></think>` block in every generation prompt, the first and each one after a reply); absent:
   * not passed, the template's default. Earlier turns' `<think>` blocks stay in the sequence as
   * generated (the template would drop them before the last user message): the tokens trained are
   * the tokens each turn was sampled on (SFT renders a conversation the same way: lib/train/sft/sft-data.ts).
   */
  enableThinking?: boolean;
  /**
   * Inline protocols (tags): an environment reply longer than this many tokens keeps its first ones
   * (Search-R1's max_obs_length, search_r1/llm_agent/generation.py `_process_next_obs`, cuts the
   * tokenized `<information>` block the same way, closing tag included). Absent: no cut.
   */
  maxObservationTokens?: number;
  /**
   * Multi-turn KV-cache reuse (default true, where the generator keeps caches: releaseCaches): each
   * episode's rows carry a cache key, so a turn computes only the tokens appended since the last
   * (the reply, template text) instead of re-prefilling the conversation; an episode's cache is
   * released when it ends, and every one when the batch ends. Episodes are the same either way.
   */
  cacheReuse?: boolean;
  /** Called after each turn with the number of episodes still active. */
  onTurn?: (info: { turn: number; active: number; finished: number }) => void;
  /**
   * Text written at the start of an assistant turn before the model generates, so the turn must go
   * on from it (the reference code-search system in training: `<python>` on turn 1, `<answer>` on
   * the last turn): `first` on turn 1, `final` on the last generation when that is not turn 1. Its
   * tokens are part of the turn: the parse, the conversation's messages and the sequence hold them,
   * the model is sampled after them. `trained` (default false): the loss mask covers them (1, as the
   * reference, whose trained response text starts with them); the sampler has no log-prob for them
   * (0, marked in Episode.forced), so a trainer computes it. Default: none.
   */
  prefill?: PrefillOptions;
  /**
   * Turn 1's sampling for every episode (the reference code-search system samples turn 1 of all its
   * rollouts at temperature 0.925 and top-p 0.92, the middles of its ranges); later turns use the
   * episode's own. The episode's `temperature` stays its own (what later turns used). Default: none.
   */
  firstTurn?: { temperature: number; topP: number };
}

export interface PrefillOptions {
  first?: string;
  final?: string;
  trained?: boolean;
}

export interface EpisodeRequest {
  question: string;
  /** Sampling temperature of this episode (default: the runner's). */
  temperature?: number;
  /** Top-p of this episode (default: the runner's). */
  topP?: number;
  /** Start from these messages instead of the protocol's (e.g. a custom system prompt). */
  messages?: ChatMessage[];
  /**
   * The question row's own chat prompt (Search-R1's processed files carry one): given to the
   * protocol, which starts from it (tags) or builds its own (code, direct).
   */
  prompt?: readonly ChatMessage[];
  /**
   * This episode's own seed. When every request of a batch has one, each generate call gives each
   * row a seed derived from it (and the turn and round), so an episode samples the same tokens
   * whatever else is in its batch: a data-parallel rank's share equals the same episodes of one process.
   */
  seed?: number;
}

export type EpisodeFinish = 'answer' | 'max_turns' | 'context';

/** One turn, as recorded for logs and trajectories. */
export interface TurnRecord {
  turn: number;
  action: TurnAction['kind'];
  /** Why a turn had no action (`no_action`, `unclosed`, `empty_code`, `empty_query`), and the open block. */
  reason?: string;
  open?: string;
  finishReason: FinishReason;
  /** Tokens of the turn kept in the sequence (the prefill not included), and tokens sampled after the action and dropped. */
  generatedTokens: number;
  /** Tokens the runner prefilled at the start of the turn (EpisodeRunnerOptions.prefill); absent when none. */
  prefillTokens?: number;
  droppedTokens: number;
  /** Extra generate calls after a stop string matched inside a non-action block. */
  resumes: number;
  /** Tokens of the environment's reply appended after the turn (0 when none). */
  envTokens: number;
  program?: ProgramSummary;
}

/**
 * A piece of the sequence, in order: text generated by the model, or appended by the runner (the
 * prompt, a prefill at the start of a turn, an environment reply).
 */
export interface Segment {
  source: 'prompt' | 'prefill' | 'model' | 'env';
  text: string;
  tokens: number;
}

export interface Episode {
  /** Position in the batch. */
  index: number;
  question: string;
  /** Prompt + every turn + every reply. */
  ids: Int32Array;
  /** 1 exactly on tokens the model generated. */
  lossMask: Uint8Array;
  /** Sampling log-probs aligned with ids (0 where the mask is 0, and on prefilled tokens). */
  logprobs: Float32Array;
  /** 1 on tokens the runner prefilled (EpisodeRunnerOptions.prefill) rather than sampled; absent without a prefill. */
  forced?: Uint8Array;
  promptTokens: number;
  temperature: number;
  /** The answer (possibly empty), or null when the episode ended without one. */
  answer: string | null;
  finish: EpisodeFinish;
  /** Assistant turns generated. */
  turns: number;
  calls: EpisodeCall[];
  /** The conversation as chat messages (stop-token text removed), for trajectories JSONL. */
  messages: ChatMessage[];
  steps: TurnRecord[];
  segments: Segment[];
  timings: {
    /** Wall time of the generate calls this episode took part in (shared with the batch). */
    generateMs: number;
    /** Wall time of its environment replies (programs, searches). */
    toolMs: number;
  };
  /** What a trainer writes to trajectories.jsonl (lib/train's TrainEpisode.record). */
  record: { finish: EpisodeFinish; messages: ChatMessage[]; calls: EpisodeCall[]; steps: TurnRecord[] };
}

export interface BatchStats {
  generateMs: number;
  toolMs: number;
  totalMs: number;
  generateCalls: number;
  /** Rows sent per generate call, in order (shows only active episodes were sent). */
  rowsPerCall: number[];
  /** Prompt tokens the generator took from episode caches instead of computing (0 without reuse). */
  cacheReusedTokens: number;
}

export interface BatchResult {
  episodes: Episode[];
  stats: BatchStats;
}

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
