// The training losses as pure functions: tensors in, a scalar loss tensor out (with its graph when an
// input requires grad). train_step (core/train.cc) calls them per micro-batch and time chunk; the
// addon exposes them to JS (`losses`, test/native-losses.test.ts checks them against hand values).
//
// Per-token tensors are target-aligned: [B, c], entry t holds the data of the token predicted at
// position t. `w` [B, c] holds the per-token loss weights of loss_weights (0 = not trained); every
// loss is a weighted SUM, and the weights sum to 1 over the (global) batch, so the loss of a batch is
// the sum of its micro-batches' and chunks' losses.
#pragma once
#include <ATen/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace slm {

// How the loss averages over the batch: Token = every trained token weighs the same (DAPO, Dr.GRPO;
// also SFT); Sequence = mean over a sequence's tokens, then over sequences (the original GRPO).
enum class LossNorm { Token, Sequence };

// Weights [s1 - s0, max(T - 1, 1)] float32 (CPU) for rows [s0, s1) of `mask` (mask[i][t] = 1 trains
// token t >= 1; entry t - 1 <-> token t): 1 / tokens per trained token (Token), or 1 / (sequences *
// the row's trained tokens) (Sequence). `tokens` / `sequences` are the batch's (or, data-parallel,
// the global batch's) trained tokens and sequences with trained tokens.
at::Tensor loss_weights(const std::vector<std::vector<uint8_t>>& mask, int64_t s0, int64_t s1, int64_t T, LossNorm norm, int64_t tokens,
                        int64_t sequences);

// log_softmax(logits / temp) over the vocabulary: logits [B, c, V], temp broadcastable ([B, 1, 1]).
at::Tensor token_logprobs(const at::Tensor& logits, const at::Tensor& temp);

// The targets' log-probs and the entropy per position from the vocabulary logits [B, c, V] float32,
// temp broadcastable ([B, 1, 1]), targets [B, c, 1] int64: {lp [B, c], ent [B, c]}, differentiable
// with respect to the logits. Equal to gathering token_logprobs and to entropy(token_logprobs), but
// without their [B, c, V] temporaries: the forward allocates one, the backward one (two when the
// entropy has a gradient) instead of ~8 (log-softmax, its exp, the one-hot scatter, each gradient).
// A training step's vocab head is ~3/4 of a small model's FLOPs and these freshly page-faulted
// tensors cost more than its matmuls.
struct TokenStats {
  at::Tensor lp, ent;
};
TokenStats token_stats(const at::Tensor& logits, const at::Tensor& temp, const at::Tensor& targets);
// Rows the CPU kernel of token_stats / head_token_stats has run since the process started: forward
// (log-sum-exp, log-prob, entropy) and backward (the gradient); ATen's operations count none. For tests.
struct HeadKernelRows {
  int64_t stats = 0, grad = 0;
};
HeadKernelRows cpu_head_kernel_rows();
// Rows of the vocabulary head per chunk, for training and teacher-forced log-probs alike: ~256 MB of
// float32 logits (64 Mi values; 441 rows of Qwen3's 151,936), what a long sequence holds at once. Each
// chunk packs the head's weights anew in each direction (BLAS), so fewer, larger chunks are faster: a
// 512-token LoRA step of the small preset (384 trained rows) took 0.92x the time of two ~128 MB chunks
// in one (2026-11-27, Zen 4, 2 threads, 8 alternated pairs), at 190 MB more peak memory.
inline int64_t head_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t(64) << 20) / std::max<int64_t>(vocab, 1)); }

// The same from hidden states [B, c, H] and the (frozen) vocab head [V, H], the projection fused in:
// the logits live in bufs (float32, grown on demand and reused by the next call; a call's backward
// must run before the next call's forward, which autograd's version check enforces).
struct HeadBuffers {
  at::Tensor logits, scratch;
};
TokenStats head_token_stats(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& temp, const at::Tensor& targets,
                            HeadBuffers& bufs);

// The positions a teacher-forced pass sends through the vocabulary head: those of [B, T - 1] (entry
// t - 1 <-> token t) where `keep` (CPU) is nonzero, in row-major order. A prompt, a tool's output and
// padding need no logits, and the head is most of a small model's FLOPs (3/4 of the `small`
// preset's), so training and scoring project only the positions whose log-prob is used.
struct HeadRows {
  int64_t B = 0, T = 0, n = 0;
  at::Tensor rows, host_rows;  // [n] int64 flat indices into [B, T - 1], on the device and on the CPU
  at::Tensor temp, targets;    // [1, n, 1]: each position's temperature (float) and target id (int64)
  // keep [B, T - 1]; ids [B, T] int64 (CPU); temp [B] float32 (CPU), one per sequence.
  HeadRows(const at::Tensor& keep, const at::Tensor& ids, const at::Tensor& temp, at::Device dev);
  at::Tensor select(const at::Tensor& x) const;   // per-token data [B, T - 1] (CPU) -> [1, n] on the device
  at::Tensor hidden(const at::Tensor& h) const;   // hidden states [B, T, H] -> [1, n, H]
  at::Tensor scatter(const at::Tensor& x) const;  // [1, n, ...] -> [B, T - 1, ...], zeros elsewhere
};

// SFT: -sum(w * lp), lp [B, c] the targets' log-probs.
at::Tensor sft_loss(const at::Tensor& lp, const at::Tensor& w);

// The clipped policy-gradient surrogate (PPO, GRPO): r = exp(lp - old_lp),
// loss = sum(w * -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)). Diagnostics without gradient:
// clipped = sum(w * [clipped term < unclipped]), ratio = sum(w * r).
struct PolicyLoss {
  at::Tensor loss, clipped, ratio;
};
PolicyLoss policy_loss(const at::Tensor& lp, const at::Tensor& old_lp, const at::Tensor& adv, const at::Tensor& w, double clip_low,
                       double clip_high);

// KL(policy || reference) per token, d = ref_lp - lp: k1 = -d, k3 = exp(d) - d - 1; sum(w * kl).
at::Tensor kl_penalty(const at::Tensor& lp, const at::Tensor& ref_lp, const at::Tensor& w, int estimator);

// Entropy per position, -sum_v p log p, from logp [B, c, V] -> [B, c] (a diagnostic).
at::Tensor entropy(const at::Tensor& logp);
// The entropy bonus term added to the loss (times entropy_coef): sum(w * sum_v p log p) (= minus the
// weighted entropy, so minimising it raises entropy).
at::Tensor entropy_bonus(const at::Tensor& logp, const at::Tensor& w);

// The clipped value loss (PPO, verl): vc = old_v + clip(v - old_v, -value_clip, value_clip),
// sum(w * 0.5 * max((v - R)^2, (vc - R)^2)).
at::Tensor value_loss(const at::Tensor& v, const at::Tensor& old_v, const at::Tensor& ret, const at::Tensor& w, double value_clip);

}  // namespace slm
