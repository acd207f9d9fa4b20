/**
 * The engine's CPU kernels on small typed arrays, synchronously (native/addon/kernels.cc): for tests and
 * benchmarks that compare them with ATen's path and with hand-computed values. Part of NativeAddon.
 */
export interface NativeKernels {
  /** One sampling step over logits [rows, vocab] (the fused CPU sampler, or ATen's path with the CPU kernels off); for tests and benchmarks. */
  sample(req: {
    logits: Float32Array;
    rows: number;
    vocab: number;
    temperature: number[];
    u: number[];
    topK?: number;
    topP?: number[];
    topN?: number;
  }): {
    tokens: number[];
    logprobs: number[];
    topIds?: number[];
    topLogprobs?: number[];
  };
  /** y [m, n] = x [m, k] · w [n, k]ᵀ through the engine's linear layer, in float32 or bfloat16 (inputs rounded to it); for tests and benchmarks. */
  linear(req: {
    x: Float32Array;
    w: Float32Array;
    m: number;
    n: number;
    k: number;
    dtype?: 'float32' | 'bfloat16';
    head?: boolean;
  }): Float32Array;
  /**
   * Generation's attention (the fused CPU kernel, or ATen's path with the CPU kernels off): q [b, nq, t, d], k/v [b, nkv, capacity, d]
   * (the first s positions used), mask [b, t, s] additive; returns [b, nq, t, d]. t defaults to 1 (a decode step). prefix P: keys
   * [0, P) are row 0's, shared by every row (the cascade KV cache of shared-prefix generation). For tests and benchmarks.
   */
  attention(req: {
    q: Float32Array;
    k: Float32Array;
    v: Float32Array;
    mask: Float32Array;
    b: number;
    nq: number;
    nkv: number;
    s: number;
    d: number;
    t?: number;
    capacity?: number;
    dtype?: 'float32' | 'bfloat16';
    prefix?: number;
  }): Float32Array;
  /**
   * Generation's RMSNorm (x [rows, d], w [d]) or per-head RMSNorm + RoPE (x [rows, positions, heads, d], cos/sin [rows, positions, d],
   * w optional: RoPE alone; positions default 1, a decode step; more, a prefill): the CPU kernel, or ATen's operations with the CPU
   * kernels off; eps 1e-6. y: x's shape; kernel: whether the kernel ran. For tests.
   */
  norm(req: {
    x: Float32Array;
    w?: Float32Array;
    rows: number;
    positions?: number;
    heads?: number;
    d: number;
    cos?: Float32Array;
    sin?: Float32Array;
    dtype?: 'float32' | 'bfloat16';
  }): { y: Float32Array; kernel: boolean };
  /** The MLP's gate of a decode step, silu(g) * u over g, u [rows, n]: the CPU kernel, or ATen's with the CPU kernels off. For tests. */
  siluMul(req: { g: Float32Array; u: Float32Array; rows: number; n: number; dtype?: 'float32' | 'bfloat16' }): {
    y: Float32Array;
    kernel: boolean;
  };
}
