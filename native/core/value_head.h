// PPO's critic, apart from the decoder: v = w . h + b on the final hidden states (float32, trainable).
// The model holds one (Qwen3Model::value_head); undefined until attached or loaded.
#pragma once
#include <ATen/Tensor.h>

#include <map>
#include <string>

#include "core/safetensors.h"

namespace slm {

struct ValueHead {
  at::Tensor w, b;  // [hidden], [1]

  bool defined() const { return w.defined(); }
  // h [.., hidden] (any dtype) -> values [..] in float32 (with gradient when the head has one).
  at::Tensor forward(const at::Tensor& h) const;
  // value_head.weight / value_head.bias, detached (what value_head.safetensors holds).
  std::map<std::string, at::Tensor> tensors() const;
  int64_t bytes() const;

  // w ~ N(0, 1/hidden) from a seeded CPU generator, b = 0.
  static ValueHead fresh(int64_t hidden, at::Device device, uint64_t seed);
  // From value_head.safetensors: ADAPTER_MISMATCH unless it holds weight [hidden] and bias [1].
  static ValueHead load(TensorMap&& t, int64_t hidden, at::Device device);
};

}  // namespace slm
