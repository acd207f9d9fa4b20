/** The OpenAI-compatible server's options: the model it serves, its name and address, its limits. */
import type { Model } from '../engine/model.js';
import type { ChatFormatter } from '../model/chat.js';
import type { HfTokenizer } from '../model/tokenizer.js';

export interface ServeOptions {
  model: Model;
  tokenizer: HfTokenizer;
  formatter: ChatFormatter;
  /** The name reported by /v1/models and in responses. */
  name: string;
  port: number;
  host?: string;
  /** Rows per batched generate call (default 32); also the largest `n`. */
  maxBatch?: number;
  /** Generate calls run at once (default 2): a request arriving while one runs does not wait for it to end. */
  maxConcurrentCalls?: number;
  /** How long rows queued while a call runs wait for it before they start a call beside it (default 200 ms). */
  concurrentAfterMs?: number;
  /** Prompt positions per prefill forward (default 512); a call whose clients all left stops between two. */
  prefillChunk?: number;
  /** Default and upper bound of max_tokens (default 512 / 4096). */
  defaultMaxTokens?: number;
  maxTokensLimit?: number;
  /**
   * The longest sequence a request may ask for, prompt plus max_tokens (vLLM's --max-model-len;
   * default the model's max_position_embeddings): a longer one is a 400 before anything is allocated.
   */
  maxModelLen?: number;
  /** The largest request body read (default 32 MiB); a larger one is a 413. */
  maxBodyBytes?: number;
  log?: (line: string) => void;
  /** The adapter the model was loaded with (requests naming no loaded adapter run with it). */
  adapter?: string;
}
