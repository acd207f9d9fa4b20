// A LoRA projection's adapter term in a CPU training forward, its products split between the threads.
//
// LoRA's products are skinny: x Aᵀ has r (8-64) columns, (x Aᵀ) Bᵀ an inner dimension of r, and the
// backward's Bᵀ and Aᵀ gradients reduce over the rows to r columns. BLAS threads each call across
// the cores, and on products this small the threads' hand-offs cost more than they share: OpenBLAS
// 0.3.21 on 2 cores of an AMD EPYC (Zen 4) ran x Aᵀ (512 x 512 by r 16) at 22-56 GFLOP/s with 2
// threads and 74 with one, the B gradient at 21 against 68 (`bench train`'s shapes; the six
// products took ~6 % of its 512-token LoRA step). Here each product is split by rows between the
// threads in one parallel region, each part a single-threaded BLAS call (inside a parallel region
// OpenBLAS's OpenMP build runs on the calling thread); the forward's scaling rides in its second
// product (BLAS's alpha), the backward's is one pass over the two r-column gradients.
//
// Applies to float32 CPU tensors (x [M, in], y [M, out], A [r, in], B [out, r]) in a training forward;
// elsewhere it returns an undefined tensor and the caller runs ATen's operations (every device).
// The result is the same whether autograd records or not (a checkpointed layer runs twice).
#pragma once
#include <ATen/ATen.h>

namespace slm {

// y + scale · (x Aᵀ) Bᵀ, differentiable in x, A and B (and y: its gradient passes through), or undefined.
at::Tensor lora_train_cpu(const at::Tensor& y, const at::Tensor& x, const at::Tensor& A, const at::Tensor& B, double scale);

}  // namespace slm
