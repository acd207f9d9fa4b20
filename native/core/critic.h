// PPO's separate critic, as Search-R1's critic is a model apart from its actor: a second LoRA adapter
// (Linear::critic) on the same frozen base weights — the base tensors are not copied, only the
// adapter's A and B — read by forwards with ForwardOptions::critic, and the value head on its final
// hidden states. Trained on the value loss alone with its own AdamW, learning rate and gradient clip
// (core/train.h); the actor's adapter never sees the value loss.
//   Checkpoint file: critic_adapter.safetensors, the critic's A and B under the actor adapter's PEFT
//   names (the critic has the actor's rank, targets and scale).
#pragma once
#include <map>
#include <string>

#include "core/optimizer.h"
#include "core/qwen3.h"
#include "core/safetensors.h"

namespace slm {

// A critic adapter equal to the actor's adapter now (verl starts the critic from the actor's
// starting model: Search-R1's train_ppo.sh critic.model.path = actor_rollout_ref.model.path), a
// copy of its A and B only. NOT_SUPPORTED when no actor adapter is attached. Replaces a critic.
void attach_critic(Qwen3Model& m);
// The critic's A and B from a file written by critic_tensors: every tensor of the actor adapter's
// projections present with the actor's shapes and nothing else (ADAPTER_MISMATCH otherwise).
void load_critic(Qwen3Model& m, TensorMap&& tensors);
void detach_critic(Qwen3Model& m);
// The critic's A and B in the actor adapter's PEFT naming (what critic_adapter.safetensors holds).
std::map<std::string, at::Tensor> critic_tensors(const Qwen3Model& m);
// Bytes of the critic adapter's tensors.
int64_t critic_bytes(const Qwen3Model& m);

// The trainable tensors split by optimizer: the actor's (its LoRA, and the value head when there is
// no separate critic) and the separate critic's (its LoRA as "critic." + PEFT name, then the value
// head); empty without a critic.
NamedParams actor_params(const Qwen3Model& m);
NamedParams critic_params(const Qwen3Model& m);

}  // namespace slm
