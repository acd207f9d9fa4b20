/**
 * The whole native surface in one place (the addon's C++ is in native/addon). Tensors never cross:
 * ids, masks and results travel as typed arrays, one call per batch.
 */
export interface NativeModelConfig {
  vocab_size: number;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  head_dim: number;
  rope_theta: number;
  rms_norm_eps: number;
  tie_word_embeddings: boolean;
}

export interface NativeModelInfo {
  numParameters: number;
  parameterBytes: number;
  dtype: string;
  device: string;
  vocabSize: number;
  numLayers: number;
  hiddenSize: number;
}

export interface NativeGenerateRequest {
  /** Prompts concatenated; `lengths[i]` ids belong to row i. */
  ids: Int32Array;
  lengths: Int32Array;
  maxNewTokens: number;
  /** One per row; <= 0 means greedy. */
  temperature: Float32Array;
  topK?: number;
  topP?: number;
  seed?: number;
  stopTokenIds?: Int32Array;
  stopStrings?: string[];
  padId?: number;
}

export interface NativeGenerateResult {
  tokens: Int32Array;
  lengths: Int32Array;
  logprobs: Float32Array;
  /** 0 = length, 1 = stop token, 2 = stop string. */
  finish: Uint8Array;
  steps: number;
  prefillSeconds: number;
  decodeSeconds: number;
}

export interface NativeModel {
  info(): NativeModelInfo;
  /** The byte string of every token id (offsets has vocab+1 entries), for stop strings. */
  setVocab(bytes: Uint8Array, offsets: Int32Array): void;
  /** [batch, seqLen, vocab] float32 logits of every position. */
  logits(req: { ids: Int32Array; batch: number; seqLen: number; attentionMask?: Int32Array; positionIds?: Int32Array }): Promise<Float32Array>;
  generate(req: NativeGenerateRequest): Promise<NativeGenerateResult>;
  /** out[t] = log p(ids[t] | ids[<t]) per row (0 at t = 0), concatenated like the input. */
  sequenceLogprobs(req: { ids: Int32Array; lengths: Int32Array; temperature?: number }): Promise<Float32Array>;
  dispose(): void;
}

export interface NativeVersion {
  torch: string;
  cuda: boolean;
  threads: number;
  /** at::show_config(): BLAS, oneDNN, CPU capability. */
  config: string;
  parallel: string;
  napi: number;
}

export interface NativeAddon {
  setErrorClass(cls: new (code: string, message: string) => Error): void;
  setThreads(n: number): void;
  version(): NativeVersion;
  /** GFLOP/s of n×n matmuls, or GB/s (read + write) of copying n bytes. */
  measure(req: { kind: 'matmul' | 'copy'; n?: number; dtype?: string; device?: string; seconds?: number }): Promise<number>;
  loadModel(req: { files: string[]; config: NativeModelConfig; dtype: string; device: string }): Promise<NativeModel>;
}
