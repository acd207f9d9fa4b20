// Linear layers for a few rows on the CPU: y = x · wᵀ with w [out, in] as the checkpoint stores it.
//
// Decoding runs every projection (and the vocabulary head) on a handful of rows — one per sequence of
// the batch. BLAS gemm is built for large products: for each call it first packs the whole weight
// matrix into its panel layout and then multiplies, so a decode step reads every weight twice and
// writes it once (profiled: sgemm's packing took as long as its arithmetic), and its threads meet at
// barriers several times per call. Here each weight row is read once, straight from where it lies, and
// multiplied with every input row while it is in L1 (register tiles of 4 input rows x 4 weight rows),
// the output columns split between the threads in one parallel region per call. Every output element
// is reduced in the same order whatever the batch size, so a row's result does not depend on the
// other rows of the batch.
//
// Chosen at run time from what the CPU offers, capped by SLM_TRAIN_CPU_ISA (core/cpu_isa.h): AVX-512
// with AVX512_BF16 (float32; bfloat16 with vdpbf16ps), AVX-512 or AVX2 + FMA (float32; bfloat16
// weights widened to float32 in registers, the sums rounded to bfloat16 once). Anything else — another device, a dtype or instruction set
// without a kernel, more rows than kMaxRows, or an autograd graph to record — returns an undefined tensor and the caller uses at::linear.
// The model code stays one path for every device: this is a dispatch in the linear layer, as ATen itself dispatches per device.
#pragma once
#include <ATen/ATen.h>

namespace slm {

// Up to this many rows the kernel measured at least as fast as BLAS here (float32, one thread, AMD
// EPYC: 1.6x at 16 rows, 1.7x for the vocabulary head, equal at 256); above, BLAS (long prefills).
constexpr int64_t kSmallLinearMaxRows = 256;

// y [.., out] = x [.., in] · wᵀ, or an undefined tensor when no kernel applies (see above).
// float_out: y in float32 whatever x's dtype (bfloat16 products are still rounded to bfloat16 first,
// so the values equal the bfloat16 output widened). out: a contiguous buffer of y's dtype with at
// least as many elements, written instead of a fresh tensor (the result is a view of it); any other
// tensor is ignored.
at::Tensor cpu_small_linear(const at::Tensor& x, const at::Tensor& w, bool float_out = false, const at::Tensor& out = at::Tensor());

// x · wᵀ (+ bias) for bfloat16 x and w on a CPU without bfloat16 dot products (cpu_isa() avx2 or
// avx512), where ATen's bfloat16 gemm runs a slow generic loop (~5 GFLOP/s against ~120 in float32
// on a 2-core EPYC): the weights widened to float32 a block of output rows at a time (~16 MiB),
// multiplied by BLAS in float32, the result rounded to bfloat16 once, as a bfloat16 gemm rounds it.
// Works under autograd (the blocks are ATen operations). Undefined when it does not apply (another
// dtype or device, a CPU with bfloat16 dot products, the CPU kernels off or capped to none).
at::Tensor cpu_linear_widened(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = at::Tensor());

// The kernels in force: "avx512-bf16 (float32; bfloat16 dot products)", "avx512 (float32; bfloat16
// stored, float32 arithmetic)", "avx2 (...)" or "none".
const char* cpu_small_linear_isa();

// For tests and benchmarks: the CPU kernels (these and the fused sampler, core/sampler_cpu.h) allowed
// (true, the default) or not (false: ATen's generic operations, the path every other device takes).
void set_cpu_kernels_enabled(bool on);
bool cpu_kernels_enabled();

}  // namespace slm
