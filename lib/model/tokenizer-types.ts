/** The tokenizer surface the rest of slm-train uses (lib/model/hf-tokenizer.ts implements it). */
export interface Tokenizer {
  readonly vocabSize: number;
  /** Ids of special tokens by content, e.g. '<|im_end|>'. */
  tokenId(content: string): number | undefined;
  /** splitSpecialTokens: special tokens written in the text are encoded as plain text (Hugging Face's split_special_tokens). */
  encode(text: string, opts?: { splitSpecialTokens?: boolean }): number[];
  /** The contents of the special tokens (`<|im_end|>`): text that must not come from an observation as such. */
  readonly specialTokens: readonly string[];
  decode(ids: ArrayLike<number>, opts?: { skipSpecialTokens?: boolean }): string;
  /** Ids that end an assistant turn (eos, <|im_end|>). */
  readonly stopTokenIds: number[];
  /**
   * The raw bytes each id stands for, indexed by id (byte-level pieces mapped back to bytes, special
   * tokens as the UTF-8 of their content): the engine checks stop strings on these bytes.
   */
  tokenBytes(): Uint8Array[];
}
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
}
