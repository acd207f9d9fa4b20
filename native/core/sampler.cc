#include "core/sampler.h"

#include <ATen/ATen.h>

namespace slm {

RowRng::RowRng(uint64_t seed, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(r), 0x5eedu};
    gens_.emplace_back(seq);
  }
}

std::vector<float> RowRng::next(const std::vector<int64_t>& rows) {
  std::vector<float> u;
  u.reserve(rows.size());
  for (auto r : rows) {
    // 53 random bits -> (0, 1]; a zero would select a token of probability zero in the CDF lookup.
    const double x = static_cast<double>(gens_[r]() >> 11) * (1.0 / 9007199254740992.0);
    u.push_back(static_cast<float>(std::max(1.0 - x, 1e-12)));
  }
  return u;
}

Sampled sample(const at::Tensor& logits, const at::Tensor& temperature, int64_t top_k, double top_p, const at::Tensor& u) {
  const int64_t V = logits.size(-1);
  auto greedy = temperature <= 0;                                    // [B] bool
  auto t_eff = at::where(greedy, at::ones_like(temperature), temperature).unsqueeze(1);
  auto logp = at::log_softmax(logits / t_eff, -1);                   // [B, V]
  auto greedy_tok = logits.argmax(-1);                               // [B]
  at::Tensor tok;
  const bool use_k = top_k > 0 && top_k < V;
  const bool use_p = top_p < 1.0;
  auto uu = u.unsqueeze(1);
  if (use_k) {
    // Sample among the k best (sorted, so top-p applies directly to them).
    auto top = logp.topk(top_k, -1, /*largest=*/true, /*sorted=*/true);
    auto p = std::get<0>(top).exp();                                 // [B, k]
    if (use_p) {
      p = p / p.sum(-1, /*keepdim=*/true);  // top-p over the renormalised top-k (as HF's warpers)
      auto cum = p.cumsum(-1);
      p = p.masked_fill((cum - p) > top_p, 0.0);
    }
    auto cdf = p.cumsum(-1);
    auto pick = at::searchsorted(cdf, uu * cdf.narrow(1, top_k - 1, 1)).clamp_max(top_k - 1);  // [B, 1]
    tok = std::get<1>(top).gather(1, pick).squeeze(1);
  } else if (use_p) {
    auto sorted = logp.sort(-1, /*descending=*/true);
    auto p = std::get<0>(sorted).exp();
    auto cum = p.cumsum(-1);
    p = p.masked_fill((cum - p) > top_p, 0.0);
    auto cdf = p.cumsum(-1);
    auto pick = at::searchsorted(cdf, uu * cdf.narrow(1, V - 1, 1)).clamp_max(V - 1);
    tok = std::get<1>(sorted).gather(1, pick).squeeze(1);
  } else {
    auto cdf = logp.exp().cumsum(-1);
    tok = at::searchsorted(cdf, uu * cdf.narrow(1, V - 1, 1)).clamp_max(V - 1).squeeze(1);
  }
  tok = at::where(greedy, greedy_tok, tok);
  return {tok, logp.gather(1, tok.unsqueeze(1)).squeeze(1)};
}

}  // namespace slm
