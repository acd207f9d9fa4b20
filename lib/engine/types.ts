/**
 * What the episode runner needs from a text generator. The native engine implements it; tests use
 * scripted generators. One call generates a whole batch (one native call per turn, never per token).
 */
/** The compute dtypes the engine runs in (model.dtype in the config, --dtype on the command line). */
export const COMPUTE_DTYPES = ['float32', 'bfloat16', 'float16'] as const;
export type ComputeDtype = (typeof COMPUTE_DTYPES)[number];

export interface GenerateRequest {
  /** Prompt token ids, one array per row (rows may differ in length; the engine left-pads). */
  prompts: Int32Array[];
  maxNewTokens: number;
  /** Per-row temperature (0 or `greedy` = argmax). */
  temperature?: number | Float32Array | number[];
  /** Nucleus mass in (0, 1]: one for every row, or one per row (the reference draws it per rollout). */
  topP?: number | number[];
  topK?: number;
  greedy?: boolean;
  seed?: number;
  /**
   * One seed per row: a row then samples the same tokens whatever batch it is in and at whatever
   * position (rather than from (seed, row index)). Data-parallel ranks and batching servers rely on it.
   */
  rowSeeds?: number[];
  /** Generation of a row stops after any of these token ids (the stop token is included in the output). */
  stopTokenIds?: number[];
  /** Generation of a row stops once its decoded output ends with any of these strings (included). */
  stopStrings?: string[];
  /**
   * Shared prefixes (default true): rows with identical prompts (e.g. the K samples of a question)
   * prefill it once, and the prefix common to all distinct prompts (e.g. the system prompt) is
   * prefilled once; each row still samples with its own seed, and the outputs equal the unshared
   * path's (same greedy tokens, log-probs within float rounding). false: every row prefills its
   * whole prompt (the old path, for comparison).
   */
  sharePrefix?: boolean;
  /**
   * Chunked prefill: prompts run through the model this many positions at a time (0 or absent: one
   * forward); a call whose every row was cancelled stops between two chunks.
   */
  prefillChunk?: number;
  /**
   * Multi-turn KV-cache reuse: one key (or null: none) per row, e.g. one per episode. A keyed row
   * reuses the longest prefix of its prompt that the key's cache holds (its previous turn's prompt
   * and output) and computes only the rest; its KV is kept under the key for the next call, until
   * the generator's releaseCaches. Keys must be distinct within a call. Outputs equal the uncached
   * path's (same greedy tokens, log-probs within float rounding). Generators may ignore it.
   */
  cacheKeys?: Array<string | null | undefined>;
}
export interface GenerateResult {
  /** Generated ids per row (not including the prompt). */
  tokens: Int32Array[];
  /** Log-prob of each generated token under softmax(logits / temperature) (untruncated). */
  logprobs: Float32Array[];
  /** Why each row stopped. */
  finishReasons: Array<'stop_token' | 'stop_string' | 'length'>;
  /** Prompt tokens taken from KV caches kept under GenerateRequest.cacheKeys instead of computed (generators that keep caches). */
  cacheReusedTokens?: number;
}
export interface TextGenerator {
  generate(req: GenerateRequest): Promise<GenerateResult>;
  /** Frees the KV caches kept under these keys (GenerateRequest.cacheKeys); present when the generator keeps any. */
  releaseCaches?(keys: string[]): void;
}

/** A token as generateStream reports it, the moment it is sampled. */
export interface TokenEvent {
  row: number;
  token: number;
  /** As GenerateResult.logprobs. */
  logprob: number;
  /** With topLogprobs: the n most likely tokens of this step, best first, under the same distribution. */
  top?: { ids: Int32Array; logprobs: Float32Array };
  /** On the row's last token: why it stopped (a cancelled row gets no such event). */
  finish?: 'stop_token' | 'stop_string' | 'length';
}

/** generateStream (lib/engine/model.ts): generate with tokens reported as they are sampled. */
export interface StreamGenerateRequest extends GenerateRequest {
  /** Per row, at most maxNewTokens: the row's own token limit (finish 'length'). */
  rowMaxNewTokens?: number[];
  /** Also return the n most likely tokens of every step with their log-probs (0: none). */
  topLogprobs?: number;
  /** Every token, in order per row, as it is sampled; all of them before generateStream resolves. */
  onToken?: (ev: TokenEvent) => void;
  /** Per row: aborting the signal stops that row before its next token (finish 'cancelled'). */
  signals?: Array<AbortSignal | undefined>;
}

export interface StreamGenerateResult {
  tokens: Int32Array[];
  logprobs: Float32Array[];
  /** With topLogprobs n: per row, n ids / log-probs per generated token (row-major). */
  topLogprobs?: Array<{ ids: Int32Array; logprobs: Float32Array }>;
  finishReasons: Array<'stop_token' | 'stop_string' | 'length' | 'cancelled'>;
  steps: number;
  /** Prompt tokens the prefill ran through the model (padding excluded) and the sum of the prompts' lengths. */
  prefillTokens: number;
  prefillTokensRequested: number;
  /** Prompt tokens taken from episode caches (cacheKeys) instead of computed. */
  cacheReusedTokens: number;
}
