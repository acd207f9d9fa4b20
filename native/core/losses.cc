#include "core/losses.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>

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

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// z = logits / temp, lse = logsumexp(z), lp = z[target] - lse, ent = lse - sum_v p_v z_v; `e` is
// scratch of the logits' shape. Returns {lp [B, c], ent [B, c], lse [B, c, 1]}.
std::array<at::Tensor, 3> stats_forward(const at::Tensor& logits, const at::Tensor& temp, const at::Tensor& targets, at::Tensor e) {
  const auto amax = std::get<0>(logits.max(-1, true));  // [B, c, 1]
  at::sub_out(e, logits, amax).div_(temp).exp_();       // exp(z - max z)
  const auto sum = e.sum(-1, true);
  auto lse = amax.div(temp).add_(sum.log());
  const auto ez = e.mul_(logits).sum(-1, true).div_(temp).div_(sum);  // sum_v p_v z_v
  auto lp = logits.gather(-1, targets).div(temp).sub_(lse).squeeze(-1);
  auto ent = lse.sub(ez).squeeze(-1);
  return {lp, ent, lse};
}

// Overwrites `logits` with d (sum g_lp lp + sum g_ent ent) / d logits: d lp / d z_v = [v = target] -
// p_v, d ent / d z_v = -p_v (log p_v + ent). `scratch` (the logits' shape) is needed when g_ent is.
void stats_backward(at::Tensor logits, const at::Tensor& temp, const at::Tensor& targets, const at::Tensor& lse, const at::Tensor& ent, const at::Tensor& g_lp,
                    const at::Tensor& g_ent, at::Tensor scratch) {
  const auto a = g_lp.defined() ? g_lp.unsqueeze(-1) : at::zeros_like(lse);  // [B, c, 1]
  auto& g = logits.div_(temp).sub_(lse);                                       // log p
  if (g_ent.defined()) {
    at::exp_out(scratch, g);  // p
    g.add_(ent.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)).add_(a).mul_(scratch).neg_();  // -p (a + g_ent (log p + ent))
  } else {
    g.exp_().mul_(a).neg_();  // -p a
  }
  g.scatter_add_(-1, targets, a).div_(temp);  // + onehot a, then d z / d logits
}

class TokenStatsFn : public torch::autograd::Function<TokenStatsFn> {
 public:
  static variable_list forward(AutogradContext* ctx, at::Tensor logits, at::Tensor temp, at::Tensor targets) {
    auto [lp, ent, lse] = stats_forward(logits, temp, targets, at::empty_like(logits));
    ctx->save_for_backward({logits, temp, targets, lse, ent});
    return {lp, ent};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto s = ctx->get_saved_variables();
    if (!g[0].defined() && !g[1].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto grad = s[0].clone();
    stats_backward(grad, s[1], s[2], s[3], s[4], g[0], g[1], g[1].defined() ? at::empty_like(grad) : at::Tensor());
    return {grad, at::Tensor(), at::Tensor()};
  }
};

// The vocab projection fused in: the logits go into `buf` (reused by every chunk of a micro-batch,
// so its pages are touched once, not per chunk), and its backward overwrites them with their
// gradient before the one matmul back to the hidden states. The head weight takes no gradient.
class HeadStatsFn : public torch::autograd::Function<HeadStatsFn> {
 public:
  static variable_list forward(AutogradContext* ctx, at::Tensor hidden, at::Tensor head, at::Tensor temp, at::Tensor targets, at::Tensor buf, at::Tensor scratch) {
    const int64_t B = hidden.size(0), c = hidden.size(1), H = hidden.size(2), V = head.size(0);
    auto logits = buf.narrow(0, 0, B * c * V).view({B, c, V});
    if (head.scalar_type() == at::kFloat && hidden.scalar_type() == at::kFloat) {
      auto flat = logits.view({B * c, V});
      at::mm_out(flat, hidden.reshape({B * c, H}), head.t());
    }
    else
      logits.copy_(at::matmul(hidden, head.t()));
    auto [lp, ent, lse] = stats_forward(logits, temp, targets, scratch.narrow(0, 0, B * c * V).view({B, c, V}));
    ctx->save_for_backward({logits, head, temp, targets, lse, ent, scratch});
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    return {lp, ent};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const variable_list none(6);
    if (!g[0].defined() && !g[1].defined()) return none;
    const auto s = ctx->get_saved_variables();
    auto logits = s[0];
    const auto& head = s[1];
    const int64_t B = logits.size(0), c = logits.size(1), V = logits.size(2);
    stats_backward(logits, s[2], s[3], s[4], s[5], g[0], g[1], g[1].defined() ? s[6].narrow(0, 0, B * c * V).view({B, c, V}) : at::Tensor());
    auto gh = at::mm(logits.view({B * c, V}).to(head.scalar_type()), head).view({B, c, head.size(1)});
    variable_list r(6);
    r[0] = gh.to(static_cast<at::ScalarType>(ctx->saved_data["hidden_dtype"].toInt()));
    return r;
  }
};

}  // namespace

TokenStats token_stats(const at::Tensor& logits, const at::Tensor& temp, const at::Tensor& targets) {
  auto r = TokenStatsFn::apply(logits, temp, targets);
  return {r[0], r[1]};
}

TokenStats head_token_stats(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& temp, const at::Tensor& targets, HeadBuffers& bufs) {
  const int64_t n = hidden.size(0) * hidden.size(1) * head.size(0);
  const auto f = hidden.options().dtype(at::kFloat);
  if (!bufs.logits.defined() || bufs.logits.numel() < n) bufs.logits = at::empty({n}, f);
  if (!bufs.scratch.defined() || bufs.scratch.numel() < n) bufs.scratch = at::empty({n}, f);
  auto r = HeadStatsFn::apply(hidden, head, temp, targets, bufs.logits, bufs.scratch);
  return {r[0], r[1]};
}

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
