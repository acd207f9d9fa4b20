#include "core/losses.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace slm {

at::Tensor loss_weights(const std::vector<std::vector<uint8_t>>& mask, int64_t s0, int64_t s1, int64_t T, LossNorm norm, int64_t tokens, int64_t sequences) {
  auto w = at::zeros({s1 - s0, std::max<int64_t>(T - 1, 1)}, at::kFloat);
  auto wa = w.accessor<float, 2>();
  for (int64_t i = s0; i < s1; ++i) {
    int64_t n = 0;
    for (size_t t = 1; t < mask[i].size(); ++t) n += mask[i][t] ? 1 : 0;
    for (size_t t = 1; t < mask[i].size() && static_cast<int64_t>(t) < T; ++t)
      if (mask[i][t]) wa[i - s0][t - 1] = norm == LossNorm::Token ? 1.f / tokens : 1.f / (sequences * n);
  }
  return w;
}

at::Tensor token_logprobs(const at::Tensor& logits, const at::Tensor& temp) { return at::log_softmax(logits / temp, -1); }

at::Tensor sft_loss(const at::Tensor& lp, const at::Tensor& w) { return -(lp * w).sum(); }

PolicyLoss policy_loss(const at::Tensor& lp, const at::Tensor& old_lp, const at::Tensor& adv, const at::Tensor& w, double clip_low, double clip_high) {
  auto ratio = at::exp(lp - old_lp);
  auto s1 = ratio * adv, s2 = at::clamp(ratio, 1 - clip_low, 1 + clip_high) * adv;
  PolicyLoss r;
  r.loss = (-at::min(s1, s2) * w).sum();
  at::NoGradGuard ng;
  r.clipped = ((s2 < s1).to(at::kFloat) * w).sum();
  r.ratio = (ratio * w).sum();
  return r;
}

at::Tensor kl_penalty(const at::Tensor& lp, const at::Tensor& ref_lp, const at::Tensor& w, int estimator) {
  auto d = ref_lp - lp;
  auto kl = estimator == 1 ? -d : at::exp(d) - d - 1;
  return (kl * w).sum();
}

at::Tensor entropy(const at::Tensor& logp) { return -(logp.exp() * logp).sum(-1); }

at::Tensor entropy_bonus(const at::Tensor& logp, const at::Tensor& w) { return (at::sum(logp.exp() * logp, -1) * w).sum(); }

at::Tensor value_loss(const at::Tensor& v, const at::Tensor& old_v, const at::Tensor& ret, const at::Tensor& w, double value_clip) {
  auto vc = old_v + at::clamp(v - old_v, -value_clip, value_clip);
  auto vl = 0.5 * at::max((v - ret).pow(2), (vc - ret).pow(2));
  return (vl * w).sum();
}

}  // namespace slm
