/**
 * What the episode runner needs from a text generator. The native engine implements it; tests use
 * scripted generators. One call generates a whole batch (one native call per turn, never per token).
 */
export interface GenerateRequest {
  /** Prompt token ids, one array per row (rows may differ in length; the engine left-pads). */
  prompts: Int32Array[];
  maxNewTokens: number;
  /** Per-row temperature (0 or `greedy` = argmax). */
  temperature?: number | Float32Array | number[];
  topP?: number;
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
}
export interface GenerateResult {
  /** Generated ids per row (not including the prompt). */
  tokens: Int32Array[];
  /** Log-prob of each generated token under softmax(logits / temperature) (untruncated). */
  logprobs: Float32Array[];
  /** Why each row stopped. */
  finishReasons: Array<'stop_token' | 'stop_string' | 'length'>;
}
export interface TextGenerator {
  generate(req: GenerateRequest): Promise<GenerateResult>;
}
