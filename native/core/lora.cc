#include "core/lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <set>

#include "core/errors.h"

namespace slm {

namespace {
const std::set<std::string> kProjections = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

bool in_layers(const LoraConfig& c, int64_t i) {
  return c.layers.empty() || std::find(c.layers.begin(), c.layers.end(), i) != c.layers.end();
}

void check_config(const Qwen3Model& m, const LoraConfig& c) {
  if (c.r <= 0) fail("ADAPTER_INVALID", "LoRA rank r must be positive, found " + std::to_string(c.r) + ".");
  if (c.targets.empty())
    fail("ADAPTER_INVALID", "LoRA needs at least one target module (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).");
  for (const auto& t : c.targets)
    if (!kProjections.count(t))
      fail("ADAPTER_TARGET_UNKNOWN", "target module '" + t +
                                         "' is not a projection of the decoder block (the same names in Qwen3, Qwen2 and Llama); expected "
                                         "some of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.");
  for (auto l : c.layers)
    if (l < 0 || l >= m.config().num_hidden_layers)
      fail("ADAPTER_INVALID",
           "layer " + std::to_string(l) + " is not in the model (it has " + std::to_string(m.config().num_hidden_layers) + " layers).");
}

std::string module_of(const std::string& proj) {
  return (proj == "gate_proj" || proj == "up_proj" || proj == "down_proj") ? "mlp" : "self_attn";
}
}  // namespace

double LoraConfig::scale() const { return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r); }

std::string peft_module(int64_t layer, const std::string& proj) {
  return "model.layers." + std::to_string(layer) + "." + module_of(proj) + "." + proj;
}

void attach_lora(Qwen3Model& m, const LoraConfig& c, uint64_t seed) {
  check_config(m, c);
  detach_lora(m);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto dev = m.device();
  auto& layers = m.layers();
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i) {
    if (!in_layers(c, i)) continue;
    for (auto& [name, lin] : layers[i].projections()) {
      if (std::find(c.targets.begin(), c.targets.end(), name) == c.targets.end()) continue;
      const int64_t out = lin->weight.size(0), in = lin->weight.size(1);
      auto lw = std::make_shared<LoraWeights>();
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      lw->A = at::empty({c.r, in}, at::kFloat).uniform_(-bound, bound, gen).to(dev).requires_grad_(true);
      lw->B = at::zeros({out, c.r}, at::TensorOptions().dtype(at::kFloat).device(dev)).requires_grad_(true);
      lw->scale = c.scale();
      lw->dropout = c.dropout;
      lin->lora = lw;
    }
  }
}

void load_lora(Qwen3Model& m, const LoraConfig& c, TensorMap&& t) {
  check_config(m, c);
  detach_lora(m);
  auto& layers = m.layers();
  const auto dev = m.device();
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i) {
    if (!in_layers(c, i)) continue;
    for (auto& [name, lin] : layers[i].projections()) {
      if (std::find(c.targets.begin(), c.targets.end(), name) == c.targets.end()) continue;
      const std::string base = "base_model.model." + peft_module(i, name);
      auto take = [&](const std::string& n, std::vector<int64_t> shape) {
        auto it = t.tensors.find(n);
        if (it == t.tensors.end()) {
          // PEFT also writes names with the adapter name ("lora_A.default.weight") in some versions.
          auto alt = n;
          alt.replace(alt.rfind(".weight"), 7, ".default.weight");
          it = t.tensors.find(alt);
        }
        if (it == t.tensors.end())
          fail("ADAPTER_MISMATCH", "the adapter has no tensor '" + n + "' although adapter_config.json targets " + name + " in layer " +
                                       std::to_string(i) + ". The adapter does not match its config.");
        auto x = it->second;
        if (x.sizes() != at::IntArrayRef(shape)) {
          std::string found = "[", want = "[";
          for (size_t k = 0; k < x.sizes().size(); ++k) found += (k ? ", " : "") + std::to_string(x.size(k));
          for (size_t k = 0; k < shape.size(); ++k) want += (k ? ", " : "") + std::to_string(shape[k]);
          fail(shape[0] == c.r || shape[1] == c.r ? "ADAPTER_MISMATCH" : "ADAPTER_MISMATCH",
               "adapter tensor '" + n + "' has shape " + found + "] but this model with r=" + std::to_string(c.r) + " needs " + want +
                   "]. The adapter was trained for another base model or rank.");
        }
        t.tensors.erase(it);
        return x.to(dev, at::kFloat).clone().requires_grad_(true);
      };
      auto lw = std::make_shared<LoraWeights>();
      lw->A = take(base + ".lora_A.weight", {c.r, lin->weight.size(1)});
      lw->B = take(base + ".lora_B.weight", {lin->weight.size(0), c.r});
      lw->scale = c.scale();
      lw->dropout = c.dropout;
      lin->lora = lw;
    }
  }
  if (!t.tensors.empty())
    fail("ADAPTER_MISMATCH", "the adapter has tensor(s) that its config does not target in this model, e.g. '" + t.tensors.begin()->first +
                                 "'. It was made for another architecture or its adapter_config.json is wrong.");
}

void detach_lora(Qwen3Model& m) {
  for (auto& L : m.layers())
    for (auto& [name, lin] : L.projections()) {
      (void)name;
      lin->lora.reset();
    }
}

void set_reference_adapter(Qwen3Model& m) {
  if (!m.has_adapter()) fail("NOT_SUPPORTED", "there is no adapter to freeze as the KL reference: load or attach one first.");
  at::NoGradGuard ng;
  for (auto& L : m.layers())
    for (auto& [name, lin] : L.projections()) {
      (void)name;
      if (!lin->lora) {
        lin->reference.reset();
        continue;
      }
      auto ref = std::make_shared<LoraWeights>(*lin->lora);
      ref->A = lin->lora->A.detach().clone();
      ref->B = lin->lora->B.detach().clone();
      lin->reference = std::move(ref);
    }
}

void clear_reference_adapter(Qwen3Model& m) {
  for (auto& L : m.layers())
    for (auto& [name, lin] : L.projections()) {
      (void)name;
      lin->reference.reset();
    }
}

bool has_reference_adapter(const Qwen3Model& m) {
  for (const auto& L : m.layers())
    for (const auto& [name, lin] : L.projections()) {
      (void)name;
      if (lin->reference) return true;
    }
  return false;
}

std::map<std::string, at::Tensor> lora_tensors(const Qwen3Model& m) {
  std::map<std::string, at::Tensor> out;
  const auto& layers = m.layers();
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
    for (const auto& [name, lin] : layers[i].projections()) {
      if (!lin->lora) continue;
      const std::string base = "base_model.model." + peft_module(i, name);
      out[base + ".lora_A.weight"] = lin->lora->A.detach();
      out[base + ".lora_B.weight"] = lin->lora->B.detach();
    }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> trainable(const Qwen3Model& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& layers = m.layers();
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
    for (const auto& [name, lin] : layers[i].projections()) {
      if (!lin->lora) continue;
      const std::string base = "base_model.model." + peft_module(i, name);
      out.emplace_back(base + ".lora_A.weight", lin->lora->A);
      out.emplace_back(base + ".lora_B.weight", lin->lora->B);
    }
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
    for (const auto& [name, lin] : layers[i].projections()) {
      if (!lin->critic) continue;  // PPO's separate critic (core/critic.h)
      const std::string base = "critic.base_model.model." + peft_module(i, name);
      out.emplace_back(base + ".lora_A.weight", lin->critic->A);
      out.emplace_back(base + ".lora_B.weight", lin->critic->B);
    }
  if (m.value_head.defined()) {
    out.emplace_back("value_head.weight", m.value_head.w);
    out.emplace_back("value_head.bias", m.value_head.b);
  }
  return out;
}

std::map<std::string, at::Tensor> merged_weights(const Qwen3Model& m, at::ScalarType dtype) {
  at::NoGradGuard ng;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : m.named_weights()) out[name] = t.to(dtype);
  const auto& layers = m.layers();
  for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
    for (const auto& [name, lin] : layers[i].projections()) {
      if (!lin->lora) continue;
      auto w = lin->weight.to(at::kFloat) + at::matmul(lin->lora->B, lin->lora->A) * lin->lora->scale;
      out[peft_module(i, name) + ".weight"] = w.to(dtype);
    }
  return out;
}

}  // namespace slm
