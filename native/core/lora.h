// LoRA adapters on a frozen Qwen3: attach (fresh, PEFT initialisation), load/save in PEFT's tensor
// naming, detach, and merge into the base weights for export.
//   PEFT names: base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
//               base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight
//   A [r, in], B [out, r]; scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/qwen3.h"
#include "core/safetensors.h"

namespace slm {

struct LoraConfig {
  int64_t r = 0;  // r, alpha, dropout: always the caller's (the addon requires them)
  double alpha = 0;
  double dropout = 0.0;
  bool rslora = false;
  std::vector<std::string> targets;  // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
  std::vector<int64_t> layers;       // empty = every layer
  double scale() const;
};

// The PEFT module path of a projection: model.layers.{i}.self_attn.q_proj / model.layers.{i}.mlp.up_proj
std::string peft_module(int64_t layer, const std::string& proj);

// Fresh adapter: A ~ kaiming-uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0 (so the model
// starts exactly at the base), seeded. Replaces any adapter already attached.
void attach_lora(Qwen3Model& m, const LoraConfig& c, uint64_t seed);
// Adapter tensors from a PEFT file: every tensor must be used and every shape must match.
void load_lora(Qwen3Model& m, const LoraConfig& c, TensorMap&& tensors);
void detach_lora(Qwen3Model& m);
// The KL reference adapter (ForwardOptions::reference): a frozen copy of the adapter attached now
// (e.g. the SFT adapter an RL stage starts from). It stays when the trained adapter is replaced
// (a checkpoint restored on resume). Without one, the reference is the base model. Raises
// NOT_SUPPORTED when no adapter is attached.
void set_reference_adapter(Qwen3Model& m);
void clear_reference_adapter(Qwen3Model& m);
bool has_reference_adapter(const Qwen3Model& m);
// name -> tensor in PEFT naming (float32).
std::map<std::string, at::Tensor> lora_tensors(const Qwen3Model& m);
// All trainable tensors by name: the LoRA adapter, the separate critic's adapter ("critic." + PEFT
// name; core/critic.h), then the value head as value_head.weight / value_head.bias.
std::vector<std::pair<std::string, at::Tensor>> trainable(const Qwen3Model& m);
// Base weights with the adapter merged (W + scale * B @ A), by Hugging Face name, in `dtype`.
std::map<std::string, at::Tensor> merged_weights(const Qwen3Model& m, at::ScalarType dtype);

}  // namespace slm
