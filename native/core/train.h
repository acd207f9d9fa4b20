// One training step in one call: micro-batches of token sequences with per-token loss masks, forward
// with LoRA (and per-layer checkpointing), the loss in use, backward, gradient-norm clipping, AdamW.
//
// Alignment: token t (t >= 1) of a sequence is predicted from the hidden state at t - 1; mask[t] = 1
// makes token t a trained target (0 for prompt, tool output and retrieved text, which are attended to
// but never trained on). Per-token data (advantages, old log-probs, returns, old values) is indexed
// like the tokens; index 0 is ignored.
//
// Losses (sums of per-token terms with weights fixed for the whole batch, so micro-batching does not
// change the result):
//   sft:  -log p(token)                                         (mean over trained tokens)
//   pg:   -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A),  r = exp(logp - old_logp)
//         + kl_coef * KL(policy || reference)   (reference = the frozen reference adapter when one is
//           set (set_reference_adapter: the SFT adapter an RL stage starts from), else the base model;
//           k1 = logp - ref_logp, k3 = exp(ref - logp) - (ref - logp) - 1)
//         - entropy_coef * entropy
//         + vf_coef * 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -value_clip, value_clip) - R)^2)
//   token-level averaging: every trained token of the batch weighs the same (DAPO, Dr.GRPO);
//   sequence-level: mean over a sequence's tokens, then mean over sequences (the original GRPO).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/qwen3.h"

namespace slm {

struct TrainBatch {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<uint8_t>> mask;
  std::vector<std::vector<float>> advantages, old_logprobs, returns, old_values;  // empty when unused
  std::vector<float> temperature;                                                 // per sequence; empty = 1
};

enum class LossKind { SFT, PG };

struct LossConfig {
  LossKind kind = LossKind::SFT;
  double clip_low = 0.2, clip_high = 0.2;
  bool token_level = true;
  double kl_coef = 0.0;
  int kl_estimator = 3;  // 1 or 3
  double entropy_coef = 0.0;
  double vf_coef = 0.0;  // > 0 trains the value head (PPO)
  double value_clip = 0.2;
};

struct OptimConfig {
  double lr = 1e-4;
  double value_lr = -1;  // < 0: same as lr
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // <= 0: no clipping
};

struct TrainOptions {
  int64_t micro_batch = 0;  // sequences per forward/backward; 0 = all at once
  bool checkpoint = true;
  bool update = true;       // false: leave the (unclipped) gradients in place for an all-reduce, then apply_gradients
  // Data-parallel training: the trained tokens / sequences of the *global* batch (every rank's), so
  // that each rank's loss weights are those of the whole batch and the SUM of the ranks' gradients
  // is the single-process gradient. 0 = this batch's own counts.
  int64_t norm_tokens = 0, norm_sequences = 0;
};

struct TrainStats {
  double loss = 0, pg_loss = 0, sft_loss = 0, kl = 0, entropy = 0, clip_frac = 0, value_loss = 0, ratio = 0;
  double grad_norm = 0;
  int64_t tokens = 0, sequences = 0;
  bool skipped = false;
  std::string skip_reason;
};

// AdamW with decoupled weight decay, as torch.optim.AdamW computes it (p *= 1 - lr*wd; then Adam).
class AdamW {
 public:
  int64_t step = 0;
  void update(const std::vector<std::pair<std::string, at::Tensor>>& params, const OptimConfig& c);
  std::map<std::string, at::Tensor> state() const;  // name.exp_avg, name.exp_avg_sq, "step"
  void load(const std::map<std::string, at::Tensor>& s, const at::Device& device);

 private:
  std::map<std::string, at::Tensor> m_, v_;
};

TrainStats train_step(Qwen3Model& m, AdamW& opt, const TrainBatch& b, const LossConfig& lc, const OptimConfig& oc, const TrainOptions& to);

// The second half of a step: gradient norm (into st.grad_norm), skip on NaN/inf (st.skipped), clipping
// to max_grad_norm, AdamW, gradients cleared. train_step calls it when to.update is true.
void apply_gradients(Qwen3Model& m, AdamW& opt, const OptimConfig& oc, TrainStats& st);

// Every trainable tensor's gradient, flattened in trainable() order (zeros where none), float32 on the
// model's device; and the inverse (a flat tensor of the same length becomes the gradients).
at::Tensor flat_gradients(const Qwen3Model& m);
void set_flat_gradients(Qwen3Model& m, const at::Tensor& flat);

}  // namespace slm
