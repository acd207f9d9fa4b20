/** The tokenizer surface the rest of slm-train uses (lib/model/tokenizer.ts implements it). */
export interface Tokenizer {
  readonly vocabSize: number;
  /** Ids of special tokens by content, e.g. '<|im_end|>'. */
  tokenId(content: string): number | undefined;
  encode(text: string): number[];
  decode(ids: ArrayLike<number>, opts?: { skipSpecialTokens?: boolean }): string;
  /** Ids that end an assistant turn (eos, <|im_end|>). */
  readonly stopTokenIds: number[];
}
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
}
