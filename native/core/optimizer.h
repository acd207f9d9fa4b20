// The optimizer half of a training step, apart from the model: AdamW over named trainable tensors
// (LoRA and value head), gradient norm, NaN/inf skip and norm clipping. Nothing here knows the model;
// callers pass trainable(m).
#pragma once
#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slm {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// Every field is set by the caller (lib/engine passes the config's values); the addon reads them.
struct OptimConfig {
  double lr = 0;
  double value_lr = -1;  // < 0: same as lr (tensors named value_head.*)
  double beta1 = 0, beta2 = 0, eps = 0;
  double weight_decay = 0.0;
  double max_grad_norm = 0;  // <= 0: no clipping
  // PPO's separate critic (core/critic.h) has its own optimizer: lr value_lr (< 0: lr) and this clip
  // on its own gradient norm (< 0: max_grad_norm; 0: no clipping).
  double critic_max_grad_norm = -1;
};

// AdamW with decoupled weight decay, as torch.optim.AdamW computes it (p *= 1 - lr*wd; then Adam).
class AdamW {
 public:
  int64_t step = 0;
  void update(const NamedParams& params, const OptimConfig& c);
  std::map<std::string, at::Tensor> state() const;  // name.exp_avg, name.exp_avg_sq, "step"
  void load(const std::map<std::string, at::Tensor>& s, const at::Device& device);
  int64_t bytes() const;  // the moment tensors' storage

 private:
  std::map<std::string, at::Tensor> m_, v_;
};

struct UpdateResult {
  double grad_norm = 0;
  bool skipped = false;
  std::string skip_reason;
};

// Drops every tensor's gradient.
void clear_grads(const NamedParams& params);
// The L2 norm of every tensor's gradient, in float64.
double grad_norm(const NamedParams& params);
// Gradient norm; skip (gradients cleared) when it or `loss` is not finite; clipping to max_grad_norm;
// AdamW; gradients cleared.
UpdateResult apply_update(const NamedParams& params, AdamW& opt, const OptimConfig& oc, double loss);

}  // namespace slm
