// RMSNorm, per-head RMSNorm + RoPE, and the MLP's SiLU gate of generation on the CPU (decode steps
// and prefills): one loop each instead of the chain of small ATen operations (cast, square, mean,
// rsqrt, multiply, cast, multiply; RoPE's multiply, negate, concatenate, multiply, add; silu,
// multiply) whose per-call cost dominates at a handful of rows (about 50 such calls per layer and
// step), and whose passes over memory cost a prefill 4-11 % of its time (512 tokens, `small` preset,
// 2-core Zen 4, 2026-11-27). Same arithmetic and the same roundings as the ATen path (bfloat16 results
// rounded where ATen rounds them); sums in float32, in another order than ATen's (the tests say how
// close). Each row's result depends on that row alone, whatever the batch or the number of positions.
//
// Float32 or bfloat16 on the CPU with the CPU kernels allowed (cpu_gemm.h) and no autograd graph;
// anything else returns an undefined tensor and the caller runs ATen's operations.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace slm {

// w * (x / sqrt(mean(x^2) + eps)) over the last dimension; x contiguous, w [H] of x's dtype.
at::Tensor cpu_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

// x [B, T, n, D] contiguous (n heads of T positions per row): per-head RMSNorm with w [D] (when w is
// defined: Qwen3's q/k norms), then rotate-half RoPE with cos/sin [B, T, 1, D] contiguous. Same shape.
at::Tensor cpu_norm_rope(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin, double eps);

// silu(g) * u, the MLP's gate (g, u [.., n] contiguous, the same shape and dtype): ATen's formula
// g / (1 + exp(-g)) in float32 with the vector exp of core/simd.h, each product rounded to the dtype
// where ATen rounds it.
at::Tensor cpu_silu_mul(const at::Tensor& g, const at::Tensor& u);

// How often each kernel ran in this process (calls that returned a result) and over how many
// positions (rows x positions: a decode step of B rows adds B, a prefill of B rows x T tokens B * T).
// Relaxed counters, for tests that check which path generation takes (a prefill through the kernels,
// not only a decode step).
struct CpuNormCount {
  uint64_t calls = 0, positions = 0;
};
struct CpuNormCounts {
  CpuNormCount rms_norm, norm_rope, silu_mul;
};
CpuNormCounts cpu_norm_counts();

}  // namespace slm
