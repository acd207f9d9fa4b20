// Teacher-forced forwards over whole sequences (no KV cache, no sampling): log-probs of given tokens,
// PPO values, last hidden states (embeddings) and every position's logits. Each runs one forward for
// the whole right-padded batch.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "core/qwen3.h"

namespace slm {

// Teacher forcing: for each sequence, out[t] = log p(ids[t] | ids[< t]) under softmax(logits /
// temperature) for t >= 1, and out[0] = 0. `temperature` holds one value for every row or one per
// row (each > 0), so rows sampled at different temperatures share one forward for the whole
// (right-padded) batch. With `reference`, the KL reference policy computes them (ForwardOptions::reference).
// With `masks` (one row per sequence, one entry per token), only positions t >= 1 with masks[b][t]
// are scored (the vocabulary head runs on those alone); the others are 0.
std::vector<std::vector<float>> sequence_logprobs(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs,
                                                  const std::vector<float>& temperature, bool reference = false,
                                                  const std::vector<std::vector<uint8_t>>& masks = {});

// PPO critic: for each sequence, out[t] = value_head.forward(h[t - 1]) for t >= 1 (the value of the
// state from which token t was generated, as the training loss reads it) and out[0] = 0; the
// adapter on (the separate critic's adapter when one is attached: core/critic.h), no dropout, no
// gradient. One forward for the whole (right-padded) batch. Needs a value head.
std::vector<std::vector<float>> sequence_values(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs);

// Embeddings: for each sequence, the final hidden state (after the last norm) of its last token,
// adapter on, no gradient; one forward for the whole (right-padded) batch. [B][hidden].
std::vector<std::vector<float>> last_hidden(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs);

// Logits of every position: ids [B, T] with an optional attention mask and explicit positions (as in
// HF's forward); returns [B, T, V] float32 on the CPU.
at::Tensor full_logits(const Qwen3Model& model, const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& positions);

}  // namespace slm
