// Generation's attention on the CPU, fused: for each (sequence, KV head, query position) the R query
// heads that share the KV head read its keys and values once, straight from the KV cache.
//
// ATen's version (matmul q·Kᵀ, scale, add the mask, softmax, cast, matmul with V) runs B x n_kv small
// batched GEMMs and five passes over [B, n_q, T, S] float32 temporaries. In a decode step at the long
// contexts of a rollout (a ~600-token system prompt plus the conversation) it took ~45 % of a
// batch-48 step; in a multi-turn prefill (48 rows appending ~80 tokens to ~770 cached ones) the
// temporaries were ~200 MB per layer, freshly page-faulted each time. Here one parallel region does it
// all: scores for the unmasked keys (masked keys, the causal future included, are not read), softmax
// in float32 with a vectorised exp, the weighted sum of V accumulated in float32. From 4 query
// positions on (a prefill), 16 positions of a KV head's R query heads go together: the scores are a
// small GEMM against the queries transposed once (no horizontal sum per key, one mask vector per key
// for 16 positions, the softmax across positions in vector lanes), and each value row read serves 4
// positions; keys masked for all 16 positions are not read.
//
// AVX-512 (16 lanes) or AVX2 + FMA (8 lanes), as cpu_isa() allows: one source, cpu_attention_impl.h,
// compiled for each (core/simd.h). float32 or bfloat16 K/V/q (bfloat16 widened in registers),
// float32 mask; anything else — another device or dtype, head_dim not a multiple of 16, an autograd
// graph, the CPU kernels switched off (cpu_gemm.h) or capped to none — returns an undefined tensor
// and the caller runs ATen's operations, the path every device takes.
#pragma once
#include <ATen/ATen.h>

namespace slm {

// q [B, n_q, T, D]; k, v [B, n_kv, S, D] (views of the cache: the last dimension contiguous);
// mask [B, 1, T, S] float32, additive (0 or the lowest float). Returns softmax(q·kᵀ·scale + mask)·v
// as [B, n_q, T, D] in q's dtype, query head h reading KV head h / (n_q / n_kv); or undefined.
// With pk/pv [1, n_kv, P, D] (a prefix every sequence shares, read from one place), keys [0, P) are
// the prefix's and [P, P + S) the sequence's own rows k/v; the mask is then [B, 1, T, P + S].
at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
                         const at::Tensor& pk = {}, const at::Tensor& pv = {});

// What this CPU gets: "avx512 (float32, bfloat16)", "avx2 (float32, bfloat16)" or "none".
const char* cpu_attention_isa();

}  // namespace slm
