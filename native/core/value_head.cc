#include "core/value_head.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "core/errors.h"

namespace slm {

at::Tensor ValueHead::forward(const at::Tensor& h) const { return at::matmul(h.to(at::kFloat), w) + b; }

std::map<std::string, at::Tensor> ValueHead::tensors() const {
  return {{"value_head.weight", w.detach()}, {"value_head.bias", b.detach()}};
}

int64_t ValueHead::bytes() const { return defined() ? (w.numel() + b.numel()) * static_cast<int64_t>(sizeof(float)) : 0; }

ValueHead ValueHead::fresh(int64_t H, at::Device device, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  ValueHead v;
  v.w = (at::randn({H}, gen, at::kFloat) / std::sqrt(static_cast<double>(H))).to(device).requires_grad_(true);
  v.b = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device)).requires_grad_(true);
  return v;
}

ValueHead ValueHead::load(TensorMap&& t, int64_t H, at::Device device) {
  auto w = t.tensors.find("value_head.weight"), b = t.tensors.find("value_head.bias");
  if (w == t.tensors.end() || b == t.tensors.end() || w->second.numel() != H || b->second.numel() != 1)
    fail("ADAPTER_MISMATCH",
         "value_head.safetensors must hold value_head.weight [" + std::to_string(H) + "] and value_head.bias [1] for this model.");
  ValueHead v;
  v.w = w->second.reshape({H}).to(device, at::kFloat).clone().requires_grad_(true);
  v.b = b->second.reshape({1}).to(device, at::kFloat).clone().requires_grad_(true);
  return v;
}

}  // namespace slm
