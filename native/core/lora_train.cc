#include "core/lora_train.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>

namespace slm {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// f(begin, end) over [0, n) in at most one part per thread.
template <class F>
void split(int64_t n, const F& f) {
  const int64_t t = std::max<int64_t>(1, at::get_num_threads());
  at::parallel_for(0, n, std::max<int64_t>(1, (n + t - 1) / t), f);
}

// out = a b, or out += alpha · a b when accumulating, the rows of a and out split between the threads.
void rows_mm(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate = false, double alpha = 1.0) {
  split(a.size(0), [&](int64_t i0, int64_t i1) {
    at::NoGradGuard ng;  // grad mode is per thread: the pool's threads must not record either
    auto o = out.narrow(0, i0, i1 - i0);
    if (accumulate)
      o.addmm_(a.narrow(0, i0, i1 - i0), b, 1.0, alpha);
    else
      at::mm_out(o, a.narrow(0, i0, i1 - i0), b);
  });
}

class LoraFn : public torch::autograd::Function<LoraFn> {
 public:
  static variable_list forward(AutogradContext* ctx, at::Tensor y, at::Tensor x, at::Tensor A, at::Tensor B, double scale) {
    const int64_t M = x.size(0), r = A.size(0);
    auto xa = at::empty({M, r}, x.options());
    rows_mm(xa, x, A.t());  // x Aᵀ   [M, r]
    auto out = y.clone(at::MemoryFormat::Contiguous);
    rows_mm(out, xa, B.t(), true, scale);  // y + scale · (x Aᵀ) Bᵀ
    ctx->save_for_backward({x, xa, A, B});
    ctx->saved_data["scale"] = scale;
    return {out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto s = ctx->get_saved_variables();
    const auto &x = s[0], &xa = s[1], &A = s[2], &B = s[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto gy = g[0].contiguous();
    const int64_t M = x.size(0), r = A.size(0), in = x.size(1), out = gy.size(1);
    auto gxa = at::empty({M, r}, gy.options());
    rows_mm(gxa, gy, B);  // gy B   [M, r]
    gxa.mul_(scale);
    auto gB = at::empty({out, r}, gy.options());
    rows_mm(gB, gy.t(), xa);  // gyᵀ (x Aᵀ)   [out, r]
    gB.mul_(scale);
    auto gAt = at::empty({in, r}, gy.options());
    rows_mm(gAt, x.t(), gxa);  // xᵀ (scale · gy B) = (the A gradient)ᵀ   [in, r]
    auto gx = at::empty({M, in}, gy.options());
    rows_mm(gx, gxa, A);  // (scale · gy B) A   [M, in]
    return {gy, gx, gAt.t().contiguous(), gB, at::Tensor()};
  }
};

}  // namespace

at::Tensor lora_train_cpu(const at::Tensor& y, const at::Tensor& x, const at::Tensor& A, const at::Tensor& B, double scale) {
  const auto f = at::kFloat;
  if (!y.is_cpu() || !x.is_cpu() || !A.is_cpu() || !B.is_cpu() || y.scalar_type() != f || x.scalar_type() != f || A.scalar_type() != f ||
      B.scalar_type() != f || x.dim() < 2)
    return at::Tensor();
  const int64_t in = x.size(-1), out = y.size(-1);
  auto x2 = x.reshape({-1, in}), y2 = y.reshape({-1, out});
  return LoraFn::apply(y2, x2, A, B, scale)[0].view(y.sizes());
}

}  // namespace slm
