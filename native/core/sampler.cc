#include "core/sampler.h"

#include <ATen/ATen.h>

#include "core/cpu_gemm.h"
#include "core/sampler_cpu.h"

namespace slm {

RowStream::RowStream(uint64_t row_seed) {
  std::seed_seq seq{static_cast<uint32_t>(row_seed), static_cast<uint32_t>(row_seed >> 32), 0x726f77u, 0x5eedu};
  gen_.seed(seq);
}

float RowStream::next() {
  // 53 random bits -> (0, 1]; a zero would select a token of probability zero in the CDF lookup.
  const double x = static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::max(1.0 - x, 1e-12));
}

RowRng::RowRng(uint64_t seed, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(r), 0x5eedu};
    gens_.emplace_back(seq);
  }
}

RowRng::RowRng(const std::vector<uint64_t>& row_seeds) {
  for (auto s : row_seeds) gens_.emplace_back(s);
}

std::vector<float> RowRng::next(const std::vector<int64_t>& rows) {
  std::vector<float> u;
  u.reserve(rows.size());
  for (auto r : rows) u.push_back(gens_[r].next());
  return u;
}

Sampled sample(const at::Tensor& logits, const std::vector<float>& temperature, int64_t top_k, const std::vector<float>& top_p,
               const at::Tensor& u, int64_t top_n) {
  if (logits.is_cpu() && cpu_kernels_enabled()) return sample_cpu(logits, temperature, top_k, top_p, u, top_n);
  const int64_t V = logits.size(-1), B = logits.size(0);
  bool any_greedy = false, all_greedy = true, all_one = true;
  std::vector<float> t_eff(temperature.size());
  for (size_t i = 0; i < temperature.size(); ++i) {
    const bool g = !(temperature[i] > 0);
    any_greedy |= g;
    all_greedy &= g;
    t_eff[i] = g ? 1.f : temperature[i];
    all_one &= t_eff[i] == 1.f;
  }
  // log p = scaled - logsumexp(scaled): the full log-softmax is never materialised.
  auto scaled = all_one ? logits : logits / at::tensor(t_eff, logits.options()).view({B, 1});
  auto lse = at::logsumexp(scaled, {-1}, /*keepdim=*/true);  // [B, 1]
  at::Tensor tok;
  if (all_greedy) {
    tok = logits.argmax(-1);
  } else {
    const bool use_k = top_k > 0 && top_k < V;
    // Top-p per row: one value for the batch stays a scalar (the same arithmetic as a single top_p);
    // rows with different values get a [B, 1] threshold (a row at 1 keeps every token).
    bool use_p = false, same_p = true;
    for (auto q : top_p) use_p |= q < 1.f, same_p &= q == top_p.front();
    at::Scalar p_one = top_p.empty() ? 1.0 : static_cast<double>(top_p.front());
    auto p_rows = same_p ? at::Tensor() : at::tensor(top_p, logits.options()).view({B, 1});
    auto beyond = [&](const at::Tensor& excl) { return same_p ? excl > p_one : excl > p_rows; };
    // Mixed values: a row at 1 samples exactly as a call without top-p would (no renormalisation, no sort).
    auto open_rows = same_p ? at::Tensor() : p_rows >= 1.0;  // [B, 1]
    auto uu = u.unsqueeze(1);
    if (use_k) {
      // Sample among the k best (sorted, so top-p applies directly to them).
      auto top = scaled.topk(top_k, -1, /*largest=*/true, /*sorted=*/true);
      auto p = (std::get<0>(top) - lse).exp();  // [B, k]
      if (use_p) {
        auto q = p / p.sum(-1, /*keepdim=*/true);  // top-p over the renormalised top-k (as HF's warpers)
        auto cum = q.cumsum(-1);
        q = q.masked_fill(beyond(cum - q), 0.0);
        p = same_p ? q : at::where(open_rows, p, q);
      }
      auto cdf = p.cumsum(-1);
      auto pick = at::searchsorted(cdf, uu * cdf.narrow(1, top_k - 1, 1)).clamp_max(top_k - 1);  // [B, 1]
      tok = std::get<1>(top).gather(1, pick).squeeze(1);
    } else if (use_p) {
      auto sorted = scaled.sort(-1, /*descending=*/true);
      auto p = (std::get<0>(sorted) - lse).exp();
      auto cum = p.cumsum(-1);
      p = p.masked_fill(beyond(cum - p), 0.0);
      auto cdf = p.cumsum(-1);
      auto pick = at::searchsorted(cdf, uu * cdf.narrow(1, V - 1, 1)).clamp_max(V - 1);
      tok = std::get<1>(sorted).gather(1, pick).squeeze(1);
      if (!same_p) {
        auto plain = (scaled - lse).exp().cumsum(-1);
        auto tok_plain = at::searchsorted(plain, uu * plain.narrow(1, V - 1, 1)).clamp_max(V - 1).squeeze(1);
        tok = at::where(open_rows.squeeze(1), tok_plain, tok);
      }
    } else {
      auto cdf = (scaled - lse).exp().cumsum(-1);
      tok = at::searchsorted(cdf, uu * cdf.narrow(1, V - 1, 1)).clamp_max(V - 1).squeeze(1);
    }
    if (any_greedy) {
      std::vector<uint8_t> g(temperature.size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = !(temperature[i] > 0);
      auto gm = at::tensor(g, at::TensorOptions().dtype(at::kByte)).to(logits.device()).to(at::kBool);
      tok = at::where(gm, logits.argmax(-1), tok);
    }
  }
  Sampled out{tok, (scaled.gather(1, tok.unsqueeze(1)) - lse).squeeze(1), at::Tensor(), at::Tensor()};
  if (top_n > 0) {
    auto top = scaled.topk(std::min(top_n, V), -1, /*largest=*/true, /*sorted=*/true);
    out.top_ids = std::get<1>(top);
    out.top_logprobs = (std::get<0>(top) - lse).to(at::kFloat);
  }
  return out;
}

}  // namespace slm
