#include "core/losses.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/cpu_gemm.h"
#include "core/cpu_isa.h"
#include "core/cpu_vec.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <vector>

namespace slm {

at::Tensor loss_weights(const std::vector<std::vector<uint8_t>>& mask, int64_t s0, int64_t s1, int64_t T, LossNorm norm, int64_t tokens,
                        int64_t sequences) {
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

// The fused head's row passes on the CPU (core/head_stats_impl.h), once per instruction set and
// picked by cpu_isa() as the other CPU kernels are (core/cpu_isa.h); with the kernels off or capped to
// none, and on every other device, the ATen operations below.
#ifdef SLM_CPU_VEC_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
namespace h512 {
using V = simd::V16;
#include "core/head_stats_impl.h"
}  // namespace h512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace h256 {
using V = simd::V8;
#include "core/head_stats_impl.h"
}  // namespace h256
#pragma GCC pop_options
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef SLM_CPU_VEC_X86
// The row passes for the level in force.
using RowStatsFn = void (*)(const float*, int64_t, float, int64_t, float*, float*, float*);
using RowGradFn = void (*)(float*, int64_t, float, float, float, float, float, int64_t);
RowStatsFn row_stats_fn() { return cpu_isa() >= CpuIsa::Avx512 ? &h512::row_stats : &h256::row_stats; }
RowGradFn row_grad_fn() { return cpu_isa() >= CpuIsa::Avx512 ? &h512::row_grad : &h256::row_grad; }
#endif
std::atomic<int64_t> kernel_stats_rows{0}, kernel_grad_rows{0};

bool cpu_stats_applies(const at::Tensor& logits) {
#ifdef SLM_CPU_VEC_X86
  return cpu_kernels_enabled() && cpu_isa() >= CpuIsa::Avx2 && logits.is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 3 &&
         logits.is_contiguous() && !(at::GradMode::is_enabled() && logits.requires_grad());
#else
  (void)logits;
  return false;
#endif
}

// A [B or 1, c or 1, 1] (or [B, c]) tensor's value for each of the B x c rows.
std::vector<float> per_row(const at::Tensor& t, int64_t B, int64_t c) {
  const auto e = (t.dim() == 2 ? t.unsqueeze(-1) : t).to(at::kCPU).to(at::kFloat).expand({B, c, 1}).contiguous();
  return std::vector<float>(e.data_ptr<float>(), e.data_ptr<float>() + B * c);
}

// z = logits / temp, lse = logsumexp(z), lp = z[target] - lse, ent = lse - sum_v p_v z_v; `e` is
// scratch of the logits' shape. Returns {lp [B, c], ent [B, c], lse [B, c, 1]}.
std::array<at::Tensor, 3> stats_forward(const at::Tensor& logits, const at::Tensor& temp, const at::Tensor& targets, at::Tensor e) {
#ifdef SLM_CPU_VEC_X86
  if (cpu_stats_applies(logits)) {
    const int64_t B = logits.size(0), c = logits.size(1), V = logits.size(2);
    const auto t = per_row(temp, B, c);
    const auto tg = targets.contiguous();
    auto lse = at::empty({B, c, 1}, logits.options()), lp = at::empty({B, c}, logits.options()), ent = at::empty({B, c}, logits.options());
    const float* x = logits.data_ptr<float>();
    const int64_t* g = tg.data_ptr<int64_t>();
    float *pl = lse.data_ptr<float>(), *pp = lp.data_ptr<float>(), *pe = ent.data_ptr<float>();
    const auto row_stats = row_stats_fn();
    kernel_stats_rows.fetch_add(B * c, std::memory_order_relaxed);
    at::parallel_for(0, B * c, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) row_stats(x + n * V, V, 1.f / t[n], g[n], pl + n, pp + n, pe + n);
    });
    return {lp, ent, lse};
  }
#endif
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
void stats_backward(at::Tensor logits, const at::Tensor& temp, const at::Tensor& targets, const at::Tensor& lse, const at::Tensor& ent,
                    const at::Tensor& g_lp, const at::Tensor& g_ent, at::Tensor scratch) {
#ifdef SLM_CPU_VEC_X86
  if (cpu_stats_applies(logits)) {
    const int64_t B = logits.size(0), c = logits.size(1), V = logits.size(2);
    const auto t = per_row(temp, B, c), L = per_row(lse, B, c), H = per_row(ent, B, c);
    const auto A = g_lp.defined() ? per_row(g_lp, B, c) : std::vector<float>(B * c, 0.f),
               Bg = g_ent.defined() ? per_row(g_ent, B, c) : std::vector<float>(B * c, 0.f);
    const auto tg = targets.contiguous();
    float* x = logits.data_ptr<float>();
    const int64_t* g = tg.data_ptr<int64_t>();
    const auto row_grad = row_grad_fn();
    kernel_grad_rows.fetch_add(B * c, std::memory_order_relaxed);
    at::parallel_for(0, B * c, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) row_grad(x + n * V, V, 1.f / t[n], L[n], H[n], A[n], Bg[n], g[n]);
    });
    return;
  }
#endif
  const auto a = g_lp.defined() ? g_lp.unsqueeze(-1) : at::zeros_like(lse);  // [B, c, 1]
  auto& g = logits.div_(temp).sub_(lse);                                     // log p
  if (g_ent.defined()) {
    at::exp_out(scratch, g);                                                           // p
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
  static variable_list forward(AutogradContext* ctx, at::Tensor hidden, at::Tensor head, at::Tensor temp, at::Tensor targets,
                               at::Tensor buf, at::Tensor scratch) {
    const int64_t B = hidden.size(0), c = hidden.size(1), H = hidden.size(2), V = head.size(0);
    auto logits = buf.narrow(0, 0, B * c * V).view({B, c, V});
    if (head.scalar_type() == at::kFloat && hidden.scalar_type() == at::kFloat) {
      auto flat = logits.view({B * c, V});
      at::mm_out(flat, hidden.reshape({B * c, H}), head.t());
    } else {  // bfloat16: widened to float32 where the CPU has no bfloat16 dot products (cpu_gemm.h)
      const auto y = cpu_linear_widened(hidden, head);
      logits.copy_(y.defined() ? y : at::matmul(hidden, head.t()));
    }
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
    stats_backward(logits, s[2], s[3], s[4], s[5], g[0], g[1],
                   g[1].defined() ? s[6].narrow(0, 0, B * c * V).view({B, c, V}) : at::Tensor());
    const auto gl = logits.view({B * c, V}).to(head.scalar_type());
    auto gh = cpu_linear_widened(gl, head.t());
    gh = (gh.defined() ? gh : at::mm(gl, head)).view({B, c, head.size(1)});
    variable_list r(6);
    r[0] = gh.to(static_cast<at::ScalarType>(ctx->saved_data["hidden_dtype"].toInt()));
    return r;
  }
};

}  // namespace

HeadKernelRows cpu_head_kernel_rows() {
  return {kernel_stats_rows.load(std::memory_order_relaxed), kernel_grad_rows.load(std::memory_order_relaxed)};
}

TokenStats token_stats(const at::Tensor& logits, const at::Tensor& temp, const at::Tensor& targets) {
  auto r = TokenStatsFn::apply(logits, temp, targets);
  return {r[0], r[1]};
}

TokenStats head_token_stats(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& temp, const at::Tensor& targets,
                            HeadBuffers& bufs) {
  const int64_t n = hidden.size(0) * hidden.size(1) * head.size(0);
  const auto f = hidden.options().dtype(at::kFloat);
  if (!bufs.logits.defined() || bufs.logits.numel() < n) bufs.logits = at::empty({n}, f);
  if (!bufs.scratch.defined() || bufs.scratch.numel() < n) bufs.scratch = at::empty({n}, f);
  auto r = HeadStatsFn::apply(hidden, head, temp, targets, bufs.logits, bufs.scratch);
  return {r[0], r[1]};
}

HeadRows::HeadRows(const at::Tensor& keep, const at::Tensor& ids, const at::Tensor& t, at::Device dev) : B(ids.size(0)), T(ids.size(1)) {
  host_rows = at::nonzero(keep.reshape({-1})).view({-1});
  n = host_rows.numel();
  rows = host_rows.to(dev);
  temp = select(t.view({B, 1}).expand({B, T - 1})).unsqueeze(-1);
  targets = select(ids.narrow(1, 1, T - 1)).unsqueeze(-1);
}

at::Tensor HeadRows::select(const at::Tensor& x) const {
  return x.reshape({-1}).index_select(0, x.is_cpu() ? host_rows : rows.to(x.device())).unsqueeze(0).to(rows.device());
}

at::Tensor HeadRows::hidden(const at::Tensor& h) const {
  return h.narrow(1, 0, T - 1).reshape({B * (T - 1), h.size(2)}).index_select(0, rows).unsqueeze(0);
}

at::Tensor HeadRows::scatter(const at::Tensor& x) const {
  const auto v = x.squeeze(0);  // [n, ...]
  auto flat = v.sizes().vec(), shape = v.sizes().vec();
  flat[0] = B * (T - 1);
  shape[0] = T - 1;
  shape.insert(shape.begin(), B);
  return at::zeros(flat, x.options()).index_copy_(0, rows, v).view(shape);
}

at::Tensor sft_loss(const at::Tensor& lp, const at::Tensor& w) { return -(lp * w).sum(); }

PolicyLoss policy_loss(const at::Tensor& lp, const at::Tensor& old_lp, const at::Tensor& adv, const at::Tensor& w, double clip_low,
                       double clip_high) {
  auto ratio = at::exp(lp - old_lp);
  auto s1 = ratio * adv, s2 = at::clamp(ratio, 1 - clip_low, 1 + clip_high) * adv;
  PolicyLoss r;
  r.loss = (-at::min(s1, s2) * w).sum();
  at::NoGradGuard ng;
  r.clipped = ((s2 < s1).to(at::kFloat) * w).sum();
  r.ratio = (ratio * w).sum();
  return r;
}

// k1 = lp - ref; k3 = exp(d) - d - 1 with d = ref - lp, as verl's kl_penalty('low_var_kl'): d clamped
// to [-20, 20] (so exp cannot overflow into an inf * 0 gradient) and the estimate to [-10, 10]; a
// clamped token takes no gradient.
at::Tensor kl_penalty(const at::Tensor& lp, const at::Tensor& ref_lp, const at::Tensor& w, int estimator) {
  auto d = ref_lp - lp;
  if (estimator == 1) return (-d * w).sum();
  d = at::clamp(d, -20, 20);
  return (at::clamp(at::exp(d) - d - 1, -10, 10) * w).sum();
}

at::Tensor entropy(const at::Tensor& logp) { return -(logp.exp() * logp).sum(-1); }

at::Tensor entropy_bonus(const at::Tensor& logp, const at::Tensor& w) { return (at::sum(logp.exp() * logp, -1) * w).sum(); }

at::Tensor value_loss(const at::Tensor& v, const at::Tensor& old_v, const at::Tensor& ret, const at::Tensor& w, double value_clip) {
  auto vc = old_v + at::clamp(v - old_v, -value_clip, value_clip);
  auto vl = 0.5 * at::max((v - ret).pow(2), (vc - ret).pow(2));
  return (vl * w).sum();
}

}  // namespace slm
