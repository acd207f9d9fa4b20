// The CPU path of `sample` (sampler.h), fused per row; see sampler_cpu.cc.
#pragma once
#include "core/sampler.h"

namespace slm {

// Same contract as `sample`, for float32 (or any floating) logits on the CPU.
Sampled sample_cpu(const at::Tensor& logits, const std::vector<float>& temperature, int64_t top_k, const std::vector<float>& top_p,
                   const at::Tensor& u, int64_t top_n);

}  // namespace slm
