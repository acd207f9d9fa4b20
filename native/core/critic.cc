#include "core/critic.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <tuple>

#include "core/errors.h"
#include "core/lora.h"

namespace slm {

namespace {
std::string peft_name(int64_t layer, const std::string& proj) { return "base_model.model." + peft_module(layer, proj); }
std::string dims(at::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
}  // namespace

bool Qwen3Model::has_critic() const {
  for (const auto& L : layers_)
    for (const auto& [name, lin] : L.projections()) {
      (void)name;
      if (lin->critic) return true;
    }
  return false;
}

void attach_critic(Qwen3Model& m) {
  if (!m.has_adapter())
    fail("NOT_SUPPORTED", "a separate critic starts as a copy of the actor's adapter: attach or load the actor's LoRA adapter first.");
  at::NoGradGuard ng;
  for (auto& L : m.layers())
    for (auto& [name, lin] : L.projections()) {
      (void)name;
      lin->critic.reset();
      if (!lin->lora) continue;
      auto c = std::make_shared<LoraWeights>(*lin->lora);
      c->A = lin->lora->A.detach().clone().requires_grad_(true);
      c->B = lin->lora->B.detach().clone().requires_grad_(true);
      lin->critic = std::move(c);
    }
}

void load_critic(Qwen3Model& m, TensorMap&& t) {
  if (!m.has_adapter()) fail("NOT_SUPPORTED", "the critic adapter takes the actor adapter's shapes: load the actor's adapter first.");
  detach_critic(m);
  auto& layers = m.layers();
  std::vector<std::pair<Linear*, std::shared_ptr<LoraWeights>>> made;
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
    for (auto& [name, lin] : layers[i].projections()) {
      if (!lin->lora) continue;
      auto c = std::make_shared<LoraWeights>(*lin->lora);
      for (auto [suffix, dst, like] :
           {std::make_tuple(".lora_A.weight", &c->A, lin->lora->A), std::make_tuple(".lora_B.weight", &c->B, lin->lora->B)}) {
        const std::string n = peft_name(i, name) + suffix;
        auto it = t.tensors.find(n);
        if (it == t.tensors.end())
          fail("ADAPTER_MISMATCH",
               "the critic adapter has no tensor '" + n + "', which the actor's adapter has; the critic file belongs to another adapter.");
        if (it->second.sizes() != like.sizes())
          fail("ADAPTER_MISMATCH", "critic adapter tensor '" + n + "' has shape " + dims(it->second.sizes()) + ", the actor's has " +
                                       dims(like.sizes()) + "; the critic file belongs to another adapter.");
        *dst = it->second.to(m.device(), at::kFloat).clone().requires_grad_(true);
        t.tensors.erase(it);
      }
      made.emplace_back(lin, std::move(c));
    }
  if (!t.tensors.empty())
    fail("ADAPTER_MISMATCH", "the critic adapter has tensor(s) the actor's adapter does not, e.g. '" + t.tensors.begin()->first +
                                 "'; the critic file belongs to another adapter.");
  for (auto& [lin, c] : made) lin->critic = std::move(c);
}

void detach_critic(Qwen3Model& m) {
  for (auto& L : m.layers())
    for (auto& [name, lin] : L.projections()) {
      (void)name;
      lin->critic.reset();
    }
}

std::map<std::string, at::Tensor> critic_tensors(const Qwen3Model& m) {
  std::map<std::string, at::Tensor> out;
  const auto& layers = m.layers();
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
    for (const auto& [name, lin] : layers[i].projections()) {
      if (!lin->critic) continue;
      out[peft_name(i, name) + ".lora_A.weight"] = lin->critic->A.detach();
      out[peft_name(i, name) + ".lora_B.weight"] = lin->critic->B.detach();
    }
  return out;
}

int64_t critic_bytes(const Qwen3Model& m) {
  int64_t n = 0;
  for (const auto& [k, v] : critic_tensors(m)) {
    (void)k;
    n += v.numel() * static_cast<int64_t>(v.element_size());
  }
  return n;
}

NamedParams actor_params(const Qwen3Model& m) {
  NamedParams out;
  const bool separate = m.has_critic();
  for (auto& [name, p] : trainable(m))
    if (name.rfind("critic.", 0) != 0 && !(separate && name.rfind("value_head.", 0) == 0)) out.emplace_back(name, p);
  return out;
}

NamedParams critic_params(const Qwen3Model& m) {
  NamedParams out;
  if (!m.has_critic()) return out;
  for (auto& [name, p] : trainable(m))
    if (name.rfind("critic.", 0) == 0 || name.rfind("value_head.", 0) == 0) out.emplace_back(name, p);
  return out;
}

}  // namespace slm
