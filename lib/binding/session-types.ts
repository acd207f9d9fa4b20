/** The native decode session's types (NativeModel.decodeSession, native/addon/session.cc). */
/** decodeSession's options: what every row of the loop shares. */
export interface NativeSessionOptions {
  topK?: number;
  topN?: number;
  stopTokenIds?: Int32Array;
  stopStrings?: string[];
  /** Prompt positions per prefill forward while other rows decode (0: a prompt at once; default 256). */
  prefillChunk?: number;
  /** Rows decoding at once (default 32); later rows wait for one to end. */
  maxRows?: number;
  padId?: number;
}

/** One row submitted to a decode session. */
export interface NativeSessionRow {
  ids: Int32Array;
  maxNewTokens: number;
  /** <= 0: greedy. */
  temperature: number;
  topP: number;
  /** The row's random stream (as generate's rowSeeds). */
  seed: number;
}

export interface NativeSessionStats {
  steps: number;
  rows: number;
  /** Rows that joined a batch already decoding. */
  joined: number;
  maxBatch: number;
  prefillTokens: number;
  rebuilds: number;
  prefillSeconds: number;
  decodeSeconds: number;
}
