// Token sampling for a batch, on the logits' device. Randomness comes from per-row host RNGs (one
// uniform number per row and step), so the same seed gives the same samples on any device, and the
// choice is an inverse-CDF lookup (cumsum + searchsorted) instead of a device generator.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

namespace slm {

struct Sampled {
  at::Tensor tokens;    // [B] int64
  at::Tensor logprobs;  // [B] float32: log softmax(logits / T)[token] (T = 1 for greedy rows), before top-k/top-p
  // With top_n > 0: the n most likely tokens of that same distribution, best first ([B, n] int64 /
  // float32); undefined otherwise.
  at::Tensor top_ids, top_logprobs;
};

// logits [B, V] float32; temperature: one per row (<= 0: greedy, argmax with the first index on
// ties), read on the host so that all-greedy or all-sampled batches skip the other path;
// top_k <= 0 or >= V: off; top_p >= 1: off; u [B] float32 uniforms in (0, 1] on the logits' device;
// top_n > 0: also return the top_n log-probs of each row (what a server's `top_logprobs` reports).
Sampled sample(const at::Tensor& logits, const std::vector<float>& temperature, int64_t top_k, const std::vector<float>& top_p,
               const at::Tensor& u, int64_t top_n = 0);

// One row's random stream: uniforms in (0, 1], from the row's own seed (what RowRng(row_seeds) gives
// that row), so a row that joins a running batch samples as it would alone.
class RowStream {
 public:
  explicit RowStream(uint64_t row_seed);
  explicit RowStream(std::seed_seq& seq) : gen_(seq) {}
  float next();

 private:
  std::mt19937_64 gen_;
};

// One independent stream per row: seeded from (seed, row), so a row's samples do not depend on
// which other rows share its batch.
class RowRng {
 public:
  RowRng(uint64_t seed, int64_t rows);
  // One stream per row from that row's own seed: a row samples the same tokens in any batch, at any
  // position (data-parallel ranks, servers that batch independent requests).
  explicit RowRng(const std::vector<uint64_t>& row_seeds);
  // Next uniform in (0, 1] for each of the given original rows.
  std::vector<float> next(const std::vector<int64_t>& rows);

 private:
  std::vector<RowStream> gens_;
};

}  // namespace slm
