/**
 * The whole native surface in one place (the addon's C++ is in native/addon). Tensors never cross:
 * ids, masks and results travel as typed arrays, one call per batch.
 */
import type { NativeKernels } from './kernel-types.js';
import type { NativeSessionOptions, NativeSessionRow, NativeSessionStats } from './session-types.js';

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
  /** Which architecture (lib/model/config.ts ARCHITECTURES); the native side rejects unknown names. */
  model_type: string;
  qk_norm: boolean;
  qkv_bias: boolean;
  o_bias: boolean;
  mlp_bias: boolean;
  /** rope_scaling: 'default' or 'llama3' (with the four numbers below). */
  rope_type: string;
  rope_factor?: number;
  rope_low_freq_factor?: number;
  rope_high_freq_factor?: number;
  rope_original_max_position_embeddings?: number;
}

export interface NativeModelInfo {
  numParameters: number;
  parameterBytes: number;
  dtype: string;
  device: string;
  vocabSize: number;
  numLayers: number;
  hiddenSize: number;
  /** Native bytes this handle holds (weights, adapter, reference adapter, value head, optimizer state), as V8 was told. */
  nativeBytes: number;
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
  /** Per row top-p (overrides topP). */
  rowTopP?: Float32Array;
  seed?: number;
  /** One seed per row (each row its own random stream, whatever its batch); overrides `seed`. */
  rowSeeds?: number[];
  stopTokenIds?: Int32Array;
  stopStrings?: string[];
  padId?: number;
  /** Per row, at most maxNewTokens: the row stops (finish 0 = length) after this many tokens. */
  rowMaxNewTokens?: Int32Array;
  /** Also return the topN most likely tokens of every step with their log-probs (0: none). */
  topN?: number;
  /** Prefill repeated prompts and the prefix common to all prompts once (default true). */
  sharePrefix?: boolean;
  /** Prompt positions per prefill forward (0: one forward); an all-cancelled call stops between chunks. */
  prefillChunk?: number;
  /**
   * Episode KV caches: one key (or null: none) per row. A keyed row reuses the longest prefix its
   * stored cache shares with its prompt and stores its KV (prompt + output) back under the key.
   */
  cacheKeys?: Array<string | null>;
}

export interface NativeGenerateResult {
  tokens: Int32Array;
  lengths: Int32Array;
  logprobs: Float32Array;
  /** With topN: topN ids / log-probs per generated token, in the order of `tokens`. */
  topIds?: Int32Array;
  topLogprobs?: Float32Array;
  /** 0 = length, 1 = stop token, 2 = stop string, 3 = cancelled. */
  finish: Uint8Array;
  steps: number;
  prefillSeconds: number;
  decodeSeconds: number;
  /** Prompt tokens run through the model in the prefill (padding excluded) / the sum of the prompts' lengths. */
  prefillTokens: number;
  prefillTokensRequested: number;
  /** Prompt tokens taken from episode caches (not computed), and the rows that reused one. */
  cacheReusedTokens: number;
  cacheHits: number;
  /** Episode caches evicted by the store's byte limit during the call. */
  cacheEvicted: number;
  /** Keyed rows whose cache was dropped because the weights changed since it was stored. */
  cacheStale: number;
}

/** The episode KV-cache store of a model handle. */
export interface NativeCacheStats {
  entries: number;
  tokens: number;
  bytes: number;
  limitBytes: number;
  /** Entries evicted by the limit / dropped as stale since the model was loaded. */
  evicted: number;
  stale: number;
}

/** One decode step of generateStream: the rows that sampled a token in it. */
export interface NativeGenerateStep {
  rows: Int32Array;
  tokens: Int32Array;
  logprobs: Float32Array;
  /** topN per row, row-major (empty without topN). */
  topIds: Int32Array;
  topLogprobs: Float32Array;
  /** Per row: 255 = still generating, else the finish code of the result. */
  finish: Uint8Array;
}

/**
 * A loaded model crosses as four handles, one per native class (native/addon/model_state.h): the
 * model (forward passes, generation, caches, export) and, as its properties, its adapter set, value
 * head and optimizer. They share one state: a call on any of them that would change what a running
 * call reads is refused with MODEL_BUSY, and dispose() on the model disposes all four.
 */
export interface NativeModel {
  readonly adapters: NativeAdapterSet;
  readonly valueHead: NativeValueHead;
  readonly optimizer: NativeOptimizer;
  info(): NativeModelInfo;
  /** The byte string of every token id (offsets has vocab+1 entries), for stop strings. */
  setVocab(bytes: Uint8Array, offsets: Int32Array): void;
  /** [batch, seqLen, vocab] float32 logits of every position. */
  logits(req: {
    ids: Int32Array;
    batch: number;
    seqLen: number;
    attentionMask?: Int32Array;
    positionIds?: Int32Array;
  }): Promise<Float32Array>;
  generate(req: NativeGenerateRequest): Promise<NativeGenerateResult>;
  /**
   * generate, streamed: `onStep` gets every decode step's tokens on the main thread, in order, as
   * they are sampled (the last steps may arrive after `done` resolves); `cancel(row)` stops a row
   * before its next token (finish 3) and drops it from the batch.
   */
  generateStream(
    req: NativeGenerateRequest,
    onStep: (step: NativeGenerateStep) => void,
  ): { done: Promise<NativeGenerateResult>; cancel(row: number): void };
  /**
   * Continuous batching (native/core/continuous.h): one decode loop that rows join while it runs,
   * started with `first` (ids 0, 1, ...). `submit` takes rows all or none: their ids, or an empty
   * array once the loop has ended (no row left: start another);
   * `onStep` gets every iteration's tokens in order (a row cancelled before a token: token -1,
   * finish 3); `done` resolves with the loop's counters when it ends (the last steps' events may
   * arrive after it).
   */
  decodeSession(
    opts: NativeSessionOptions,
    onStep: (step: NativeGenerateStep) => void,
    first: NativeSessionRow[],
  ): { done: Promise<NativeSessionStats>; submit(rows: NativeSessionRow[]): number[]; cancel(row: number): void };
  /**
   * out[t] = log p(ids[t] | ids[<t]) per row (0 at t = 0), concatenated like the input. `reference`:
   * under the KL reference policy (the frozen reference adapter, else the base model).
   */
  /** temperature: one for every row, or one per row (each > 0); default 1. */
  sequenceLogprobs(req: {
    ids: Int32Array;
    lengths: Int32Array;
    temperature?: number | Float32Array;
    reference?: boolean;
    mask?: Uint8Array;
  }): Promise<Float32Array>;
  /** Final hidden state (after the last norm) of each sequence's last token, [rows x hidden] flattened. */
  lastHidden(req: { ids: Int32Array; lengths: Int32Array }): Promise<Float32Array>;
  /** Frees the episode caches of these keys (unknown keys: nothing). */
  releaseCaches(keys: string[]): void;
  clearCaches(): void;
  /** The episode cache store's byte limit: beyond it the least recently used caches are evicted. */
  setCacheLimit(bytes: number): void;
  cacheStats(): NativeCacheStats;
  /** Base weights with the adapter merged, in Hugging Face names, to one safetensors file. */
  saveMerged(req: { file: string; dtype: string }): Promise<void>;
  /** FNV-1a digest of every base weight's bytes. */
  baseDigest(): string;
  dispose(): void;
}

/** model.adapters: the LoRA adapter, the frozen KL reference adapter, the trainable tensors' values. */
export interface NativeAdapterSet {
  /** A fresh adapter (B = 0); the optimizer starts afresh. */
  attach(spec: NativeLoraSpec & { seed?: number }): void;
  load(spec: NativeLoraSpec & { file: string }): Promise<void>;
  /** The bare base model: no adapter, separate critic or value head; fresh optimizers. */
  detach(): void;
  save(req: { file: string; valueHeadFile?: string; criticFile?: string }): Promise<void>;
  /** Freezes the adapter attached now as the KL reference policy (kept when the adapter is replaced). */
  setReference(): void;
  /** The KL reference is the base model again. */
  clearReference(): void;
  hasReference(): boolean;
  /** Copies of the trainable tensors (adapter, separate critic, value head; or their gradients) by PEFT name. */
  trainable(opts?: { grad?: boolean }): Record<string, Float32Array>;
  setTrainable(name: string, values: Float32Array): void;
}

/**
 * model.valueHead: PPO's critic. The value head, and the separate critic: a second LoRA adapter on
 * the same frozen base weights, a copy of the actor's adapter now (attachCritic) or read from
 * critic_adapter.safetensors (loadCritic, after the actor's adapter). While one is attached, values()
 * read its forward and trainStep trains it on the value loss alone with its own optimizer (valueLr,
 * criticMaxGradNorm); the actor's adapter gets the other terms.
 */
export interface NativeValueHead {
  attach(seed?: number): void;
  load(file: string): void;
  /** Values per token (value of the state before it; 0 at t = 0), adapter on, no dropout. */
  values(req: { ids: Int32Array; lengths: Int32Array }): Promise<Float32Array>;
  attachCritic(): void;
  loadCritic(file: string): void;
  detachCritic(): void;
  hasCritic(): boolean;
}

/** model.optimizer: train steps (one native call each), their gradients and AdamW state. */
export interface NativeOptimizer {
  trainStep(req: NativeTrainRequest): Promise<NativeTrainStats>;
  /** Every trainable tensor's gradient, flattened in trainable() order (zeros where none). */
  gradients(): Float32Array;
  /** Norm, NaN/inf skip, clipping, AdamW on the given flat gradients (or those left by trainStep({update: false})). */
  applyGradients(opts: NativeOptimOptions & { loss?: number; valueLoss?: number }, grads?: Float32Array): Promise<NativeApplyResult>;
  /** The actor's and the separate critic's AdamW state, one safetensors file. */
  save(file: string): Promise<void>;
  load(file: string): Promise<void>;
}

export interface NativeLoraSpec {
  r: number;
  alpha: number;
  dropout: number;
  rslora: boolean;
  targets: string[];
  layers?: number[];
}

export interface NativeTrainRequest {
  ids: Int32Array;
  lengths: Int32Array;
  /** Per token: 1 = trained target (token t is predicted from position t - 1). */
  mask: Uint8Array;
  advantages?: Float32Array;
  oldLogprobs?: Float32Array;
  returns?: Float32Array;
  oldValues?: Float32Array;
  /** Per token: a factor on the entropy term's weight (loss_norm 'turn': the per-turn mean); absent = 1. */
  entropyScale?: Float32Array;
  /**
   * The ratio's old log-probs are the training forward's own, detached (algorithm.old_logprobs
   * 'forward'): r = 1 exactly under the forward's LoRA dropout mask; oldLogprobs is then not read.
   */
  oldFromForward?: boolean;
  /** Per sequence sampling temperature (log-probs under softmax(logits / T)). */
  temperature?: Float32Array;
  loss: 'sft' | 'pg';
  /** Required for loss 'pg' (no native default; lib/config/schema.ts has the configured one). */
  clipLow?: number;
  /** Default: clipLow (symmetric clipping). */
  clipHigh?: number;
  tokenLevel?: boolean;
  klCoef?: number;
  /** Required when klCoef > 0 with loss 'pg'. */
  klEstimator?: 1 | 3;
  entropyCoef?: number;
  vfCoef?: number;
  /** Required when vfCoef > 0. */
  valueClip?: number;
  lr?: number;
  valueLr?: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
  weightDecay?: number;
  maxGradNorm?: number;
  /** The separate critic's gradient clip (its own norm); absent: maxGradNorm. */
  criticMaxGradNorm?: number;
  microBatch?: number;
  checkpoint?: boolean;
  /** false: leave the unclipped gradients in place (gradients(), then applyGradients). */
  update?: boolean;
  /** Trained tokens / sequences of the global batch (data-parallel ranks); default: this batch's. */
  normTokens?: number;
  normSequences?: number;
  /** Seeds the native random generators at the start of this step (LoRA dropout); absent: not reseeded. */
  seed?: number;
}

export type NativeOptimOptions = Pick<
  NativeTrainRequest,
  'lr' | 'valueLr' | 'beta1' | 'beta2' | 'eps' | 'weightDecay' | 'maxGradNorm' | 'criticMaxGradNorm'
>;

export interface NativeApplyResult {
  gradNorm: number;
  /** The separate critic's gradient norm before clipping (0 without one). */
  criticGradNorm: number;
  skipped: boolean;
  skipReason: string;
  step: number;
}

/** The CPU tensors' caching allocator's counters (native/core/cpu_cache.h). */
export interface NativeCpuCacheStats {
  installed: boolean;
  cachedBytes: number;
  liveBytes: number;
  capBytes: number;
  hits: number;
  misses: number;
}

export interface NativeTrainStats {
  loss: number;
  pgLoss: number;
  sftLoss: number;
  kl: number;
  entropy: number;
  clipFrac: number;
  ratio: number;
  valueLoss: number;
  /** The actor's gradient norm before clipping (with a shared critic: the adapter and value head together). */
  gradNorm: number;
  /** The separate critic's (its adapter and value head) before clipping; 0 without one. */
  criticGradNorm?: number;
  tokens: number;
  sequences: number;
  /** Positions the vocabulary head projected in this process: the trained ones (a prompt's are skipped). */
  headRows: number;
  /** The chunks of rows the head ran them in (~256 MB of float32 logits each). */
  headChunks: number;
  skipped: boolean;
  skipReason: string;
  step: number;
}

/** Instruction-set levels of the CPU kernels, from the most to the least (SLM_TRAIN_CPU_ISA). */
export const CPU_ISA_LEVELS = ['avx512-bf16', 'avx512', 'avx2', 'none'] as const;
export type CpuIsaLevel = (typeof CPU_ISA_LEVELS)[number];

export interface NativeVersion {
  torch: string;
  cuda: boolean;
  threads: number;
  /** at::show_config(): BLAS, oneDNN, CPU capability. */
  config: string;
  parallel: string;
  /** The CPU kernels for linear layers over a few rows (decode): "avx512-bf16 (float32; bfloat16 dot products)", "avx2 (float32; bfloat16 stored, float32 arithmetic)", "none", ... */
  smallLinear: string;
  /** The fused attention kernel of generation: "avx512 (float32, bfloat16)", "avx2 (float32, bfloat16)" or "none" (ATen's operations). */
  attentionKernel: string;
  /** The instruction set the CPU kernels use now: the CPU's, capped by SLM_TRAIN_CPU_ISA or setCpuIsa. */
  cpuIsa: CpuIsaLevel;
  /** What this CPU supports. */
  cpuIsaDetected: CpuIsaLevel;
  napi: number;
  /** glibc malloc's thresholds as the addon set them when it loaded (or whose they are). */
  malloc: string;
  /** The CPU tensors' caching allocator (native/core/cpu_cache.h): "caching blocks >= 64 KiB, at most N MiB cached", or why it is off. */
  cpuCache: string;
}

export interface NativeAddon extends NativeKernels {
  setErrorClass(cls: new (code: string, message: string) => Error): void;
  setThreads(n: number): void;
  version(): NativeVersion;
  /** The CPU tensors' caching allocator's counters; release: true frees its cached blocks first. */
  cpuCacheStats(opts?: { release?: boolean }): NativeCpuCacheStats;
  /**
   * How often the fused RMSNorm, q/k norm + RoPE and SiLU-gate kernels of generation ran in this process, and over how many
   * positions (rows x positions: a decode step of B rows adds B, a prefill of B rows x T tokens B * T). For tests of which path runs.
   */
  cpuNormCounts(): Record<'rmsNorm' | 'normRope' | 'siluMul', { calls: number; positions: number }>;
  /** Allows (true, the default) or forbids the CPU kernels (small-row linear layers, fused sampler, attention): false = ATen's generic path; for benchmarks and tests. */
  setCpuKernels(on: boolean): void;
  /** Caps the CPU kernels' instruction set (a level above the CPU's gives the CPU's); returns the level in force. For tests and benchmarks. */
  setCpuIsa(level: CpuIsaLevel): CpuIsaLevel;
  /** V8's count of external memory (bytes) as Node-API reports it; each model handle adds what it holds natively. */
  externalMemory(): number;
  /** The training losses of native/core/losses.h on small arrays (tests). */
  losses: NativeLosses;
  /** GFLOP/s of n×n matmuls, or GB/s (read + write) of copying n bytes. */
  measure(req: { kind: 'matmul' | 'copy' | 'read'; n?: number; dtype?: string; device?: string; seconds?: number }): Promise<number>;
  loadModel(req: { files: string[]; config: NativeModelConfig; dtype: string; device: string }): Promise<NativeModel>;
}

/** A loss and its gradient with respect to the call's first per-token input. */
export interface NativeLossResult {
  loss: number;
  grad: Float32Array;
}

/**
 * The training losses as train steps compute them (native/core/losses.h), on one row of n
 * target-aligned values each (entry t: the token predicted at position t). Every loss is a weighted
 * sum with the per-token weights of `weights`.
 */
export interface NativeLosses {
  /**
   * Per-token loss weights aligned with `mask` (entry 0 of each row is 0): 1 / tokens ('token') or
   * 1 / (sequences x the row's trained tokens) ('sequence'); tokens / sequences default to the mask's.
   */
  weights(req: { mask: Uint8Array; lengths: Int32Array; norm: 'token' | 'sequence'; tokens?: number; sequences?: number }): Float32Array;
  /** -sum(w lp). */
  sft(req: { logprobs: Float32Array; weights: Float32Array }): NativeLossResult;
  /** sum(w * -min(r A, clip(r, 1 - clipLow, 1 + clipHigh) A)), r = exp(lp - old); clipped = sum(w [clipped < unclipped]), ratio = sum(w r). */
  policy(req: {
    logprobs: Float32Array;
    oldLogprobs: Float32Array;
    advantages: Float32Array;
    weights: Float32Array;
    clipLow: number;
    clipHigh: number;
  }): NativeLossResult & { clipped: number; ratio: number };
  /** sum(w kl), d = ref - lp: k1 = -d, k3 = exp(d) - d - 1. */
  kl(req: { logprobs: Float32Array; refLogprobs: Float32Array; weights: Float32Array; estimator: 1 | 3 }): NativeLossResult;
  /** loss: the entropy bonus term sum(w sum_v p log p) (grad: with respect to the logits); entropy: sum(w H); logprobs: log_softmax(logits / temperature). */
  entropy(req: {
    logits: Float32Array;
    vocab: number;
    weights: Float32Array;
    temperature?: number;
  }): NativeLossResult & { entropy: number; logprobs: Float32Array };
  /**
   * The train step's fused vocab head (token_stats): per position, the target's log-prob under
   * softmax(logits / temperature) and the entropy; grad = d (sum gradLogprobs lp + sum gradEntropy H) /
   * d logits (empty when neither is given).
   */
  tokenStats(req: {
    logits: Float32Array;
    vocab: number;
    targets: Int32Array;
    temperature?: number;
    gradLogprobs?: Float32Array;
    gradEntropy?: Float32Array;
  }): {
    logprobs: Float32Array;
    entropy: Float32Array;
    grad: Float32Array;
    /** Rows the CPU kernel ran in this call, forward and backward (0: ATen's operations). */
    kernelRows: { stats: number; grad: number };
  };
  /** sum(w * 0.5 max((v - R)^2, (old + clip(v - old, -valueClip, valueClip) - R)^2)). */
  value(req: {
    values: Float32Array;
    oldValues: Float32Array;
    returns: Float32Array;
    weights: Float32Array;
    valueClip: number;
  }): NativeLossResult;
}
