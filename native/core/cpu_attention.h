// One decode step's attention on the CPU, fused: for each (sequence, KV head) the R query heads that
// share the KV head read its keys and values once, straight from the KV cache.
//
// ATen's version of a decode step (matmul q·Kᵀ, scale, add the mask, softmax, cast, matmul with V)
// runs B x n_kv tiny batched GEMMs and five passes over [B, n_q, S] temporaries; at the long contexts
// of a rollout (a ~600-token system prompt plus the conversation) it took ~45 % of a batch-48 decode
// step. Here one parallel region does it all: scores for the unmasked keys (masked keys are not read),
// softmax in float32 with a vectorised exp, the weighted sum of V accumulated in float32.
//
// AVX-512 only (float32 or bfloat16 K/V/q, float32 mask); anything else — another device or dtype,
// head_dim not a multiple of 16, an autograd graph, the CPU kernels switched off (cpu_gemm.h) —
// returns an undefined tensor and the caller runs ATen's operations, the path every device takes.
#pragma once
#include <ATen/ATen.h>

namespace slm {

// q [B, n_q, 1, D]; k, v [B, n_kv, S, D] (views of the cache: the last dimension contiguous);
// mask [B, 1, 1, S] float32, additive (0 or the lowest float). Returns softmax(q·kᵀ·scale + mask)·v
// as [B, n_q, 1, D] in q's dtype, query head h reading KV head h / (n_q / n_kv); or undefined.
at::Tensor cpu_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale);

// What this CPU gets: "avx512 (float32, bfloat16)" or "none".
const char* cpu_decode_attention_isa();

}  // namespace slm
