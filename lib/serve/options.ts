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
  /** Rows decoding at once in a decode session (default 32); also the largest `n`. */
  maxBatch?: number;
  /** Decode sessions at once (default 2): rows whose settings differ from the running session's start one beside it. */
  maxConcurrentCalls?: number;
  /** Prompt positions per prefill forward, between two decode steps of the running rows (default 512; 0: a prompt at once). */
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
