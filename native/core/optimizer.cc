#include "core/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "core/errors.h"

namespace slm {

void AdamW::update(const NamedParams& params, const OptimConfig& c) {
  at::NoGradGuard ng;
  ++step;
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(step));
  for (const auto& [name, p] : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    const double lr = (name.rfind("value_head.", 0) == 0 && c.value_lr >= 0) ? c.value_lr : c.lr;
    auto& m = m_[name];
    auto& v = v_[name];
    if (!m.defined()) {
      m = at::zeros_like(p);
      v = at::zeros_like(p);
    }
    auto pd = p.detach();
    if (c.weight_decay != 0) pd.mul_(1 - lr * c.weight_decay);
    m.mul_(c.beta1).add_(g, 1 - c.beta1);
    v.mul_(c.beta2).addcmul_(g, g, 1 - c.beta2);
    auto denom = (v.sqrt() / std::sqrt(bc2)).add_(c.eps);
    pd.addcdiv_(m, denom, -lr / bc1);
  }
}

std::map<std::string, at::Tensor> AdamW::state() const {
  std::map<std::string, at::Tensor> s;
  for (const auto& [k, t] : m_) s[k + ".exp_avg"] = t;
  for (const auto& [k, t] : v_) s[k + ".exp_avg_sq"] = t;
  s["step"] = at::tensor({step}, at::kLong);
  return s;
}

void AdamW::load(const std::map<std::string, at::Tensor>& s, const at::Device& device) {
  m_.clear();
  v_.clear();
  auto it = s.find("step");
  if (it == s.end()) fail("CHECKPOINT_INVALID", "optimizer state has no 'step' entry.");
  step = it->second.to(at::kLong).item<int64_t>();
  const std::string a = ".exp_avg", b = ".exp_avg_sq";
  for (const auto& [k, t] : s) {
    if (k.size() > b.size() && k.compare(k.size() - b.size(), b.size(), b) == 0)
      v_[k.substr(0, k.size() - b.size())] = t.to(device, at::kFloat).clone();
    else if (k.size() > a.size() && k.compare(k.size() - a.size(), a.size(), a) == 0)
      m_[k.substr(0, k.size() - a.size())] = t.to(device, at::kFloat).clone();
  }
}

int64_t AdamW::bytes() const {
  int64_t n = 0;
  for (const auto* d : {&m_, &v_})
    for (const auto& [k, t] : *d) {
      (void)k;
      n += t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    }
  return n;
}

void clear_grads(const NamedParams& params) {
  for (const auto& [name, p] : params) {
    (void)name;
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

double grad_norm(const NamedParams& params) {
  double sq = 0;
  for (const auto& [name, p] : params) {
    (void)name;
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

UpdateResult apply_update(const NamedParams& params, AdamW& opt, const OptimConfig& oc, double loss) {
  UpdateResult r;
  // Gradient norm over every trainable tensor; a NaN/inf gradient skips the update.
  r.grad_norm = grad_norm(params);
  if (!std::isfinite(r.grad_norm) || !std::isfinite(loss)) {
    r.skipped = true;
    r.skip_reason = !std::isfinite(loss) ? "the loss is not finite (NaN or inf): the update was skipped"
                                         : "the gradient is not finite (NaN or inf): the update was skipped";
    clear_grads(params);
    return r;
  }
  if (oc.max_grad_norm > 0 && r.grad_norm > oc.max_grad_norm) {
    at::NoGradGuard ng;
    const double coef = oc.max_grad_norm / (r.grad_norm + 1e-6);
    for (const auto& [name, p] : params) {
      (void)name;
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }
  opt.update(params, oc);
  clear_grads(params);
  return r;
}

}  // namespace slm
