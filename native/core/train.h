// One training step in one call: micro-batches of token sequences with per-token loss masks, forward
// with LoRA (and per-layer checkpointing), the loss in use, backward, gradient-norm clipping, AdamW.
//
// Alignment: token t (t >= 1) of a sequence is predicted from the hidden state at t - 1; mask[t] = 1
// makes token t a trained target (0 for prompt, tool output and retrieved text, which are attended to
// but never trained on). Per-token data (advantages, old log-probs, returns, old values) is indexed
// like the tokens; index 0 is ignored.
//
// Losses (core/losses.h: sums of per-token terms with weights fixed for the whole batch, so
// micro-batching does not change the result):
//   sft:  -log p(token)                                         (mean over trained tokens)
//   pg:   -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A),  r = exp(logp - old_logp)
//         + kl_coef * KL(policy || reference)   (reference = the frozen reference adapter when one is
//           set (set_reference_adapter: the SFT adapter an RL stage starts from), else the base model;
//           k1 = logp - ref_logp, k3 = exp(ref - logp) - (ref - logp) - 1)
//         - entropy_coef * entropy   (per token: its loss weight times entropy_scale when given)
//         + vf_coef * 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -value_clip, value_clip) - R)^2)
//   With a separate critic (core/critic.h: a second adapter on the same frozen base) the terms above
//   but the value loss train the actor's adapter, and the critic's adapter and value head train on
//   the value loss alone (weight 1, not vf_coef: verl's dp_critic.py `loss = vf_loss`), computed on
//   the critic's own forward; vf_coef > 0 still switches the value loss on. Each side is clipped to
//   its own norm and stepped by its own AdamW (apply_gradients).
//   token-level averaging: every trained token of the batch weighs the same (DAPO, Dr.GRPO);
//   sequence-level: mean over a sequence's tokens, then mean over sequences (the original GRPO).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/losses.h"
#include "core/optimizer.h"
#include "core/qwen3.h"

namespace slm {

struct TrainBatch {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<uint8_t>> mask;
  std::vector<std::vector<float>> advantages, old_logprobs, returns, old_values;  // empty when unused
  // Per-token factor on the entropy term's weight (e.g. the reference code-search system's per-turn
  // mean: the policy loss's turn weights folded into its advantages); empty = 1.
  std::vector<std::vector<float>> entropy_scale;
  std::vector<float> temperature;  // per sequence; empty = 1
};

enum class LossKind { SFT, PG };

// No defaults for the numbers the trainers choose (lib/config/schema.ts holds them): the addon
// requires clip_low for the policy loss and value_clip for the value loss.
struct LossConfig {
  LossKind kind = LossKind::SFT;
  double clip_low = 0, clip_high = 0;
  bool token_level = true;  // LossNorm::Token, else LossNorm::Sequence (the policy loss only; SFT is per token)
  double kl_coef = 0.0;
  int kl_estimator = 3;  // 1 or 3
  double entropy_coef = 0.0;
  // The ratio's old log-probs are the training forward's own, detached: r = 1 exactly under whatever
  // LoRA dropout mask the forward draws, the gradient -A grad log p (one pass on fresh samples; no
  // old_logprobs needed).
  bool old_from_forward = false;
  double vf_coef = 0.0;  // > 0 trains the value head (PPO)
  double value_clip = 0;
};

struct TrainOptions {
  int64_t micro_batch = 0;  // sequences per forward/backward; 0 = all at once
  bool checkpoint = true;
  bool update = true;  // false: leave the (unclipped) gradients in place for an all-reduce, then apply_gradients
  // Data-parallel training: the trained tokens / sequences of the *global* batch (every rank's), so
  // that each rank's loss weights are those of the whole batch and the SUM of the ranks' gradients
  // is the single-process gradient. 0 = this batch's own counts.
  int64_t norm_tokens = 0, norm_sequences = 0;
  // Seeds libtorch's default generators (LoRA dropout) at the start of the step; unset = left as is.
  std::optional<uint64_t> seed;
};

struct TrainStats {
  double loss = 0, pg_loss = 0, sft_loss = 0, kl = 0, entropy = 0, clip_frac = 0, value_loss = 0, ratio = 0;
  double grad_norm = 0;         // the actor's (with a shared critic: actor and value head together)
  double critic_grad_norm = 0;  // the separate critic's (its adapter and value head), before clipping
  int64_t tokens = 0, sequences = 0;
  // Positions the vocabulary head projected: the trained ones (a loss weight), not the prompt's.
  int64_t head_rows = 0;
  int64_t head_chunks = 0;  // the chunks of rows it ran them in (head_chunk_rows, core/losses.h)
  bool skipped = false;
  std::string skip_reason;
};

// `critic_opt`: the separate critic's optimizer, required when the model has a critic adapter.
TrainStats train_step(Qwen3Model& m, AdamW& opt, const TrainBatch& b, const LossConfig& lc, const OptimConfig& oc, const TrainOptions& to,
                      AdamW* critic_opt = nullptr);

// The second half of a step on the model's trainable tensors (core/optimizer.h apply_update):
// st.grad_norm, st.skipped / skip_reason from it. train_step calls it when to.update is true. With a
// separate critic, the actor's tensors (opt, oc.lr, oc.max_grad_norm, loss st.loss) and the critic's
// (critic_opt, oc.value_lr, oc.critic_max_grad_norm, loss st.value_loss) are updated apart; a critic
// without any gradient (no value loss in the step) is left as it is.
void apply_gradients(Qwen3Model& m, AdamW& opt, const OptimConfig& oc, TrainStats& st, AdamW* critic_opt = nullptr);

// Every trainable tensor's gradient, flattened in trainable() order (zeros where none), float32 on the
// model's device; and the inverse (a flat tensor of the same length becomes the gradients).
at::Tensor flat_gradients(const Qwen3Model& m);
void set_flat_gradients(Qwen3Model& m, const at::Tensor& flat);

}  // namespace slm
