#include "core/train.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "core/errors.h"
#include "core/lora.h"

namespace slm {

void AdamW::update(const std::vector<std::pair<std::string, at::Tensor>>& params, const OptimConfig& c) {
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

namespace {

// Packs rows [s0, s1) of per-token data into [b, T-1] target-aligned tensors (index t-1 <-> token t).
at::Tensor pack(const std::vector<std::vector<float>>& src, int64_t s0, int64_t s1, int64_t T, const char* what, size_t expect_rows) {
  auto out = at::zeros({s1 - s0, std::max<int64_t>(T - 1, 1)}, at::kFloat);
  if (src.empty()) return out;
  if (src.size() != expect_rows) fail("ARGUMENT_INVALID", std::string(what) + " must have one row per sequence.");
  auto a = out.accessor<float, 2>();
  for (int64_t i = s0; i < s1; ++i)
    for (size_t t = 1; t < src[i].size(); ++t) a[i - s0][t - 1] = src[i][t];
  return out;
}

// Drops every trainable tensor's gradient.
void clear_grads(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  for (const auto& [name, p] : params) {
    (void)name;
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

// The L2 norm of every trainable tensor's gradient, in float64.
double grad_norm(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  double sq = 0;
  for (const auto& [name, p] : params) {
    (void)name;
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

}  // namespace

TrainStats train_step(Qwen3Model& m, AdamW& opt, const TrainBatch& b, const LossConfig& lc, const OptimConfig& oc, const TrainOptions& to) {
  TrainStats st;
  auto params = trainable(m);
  if (params.empty()) fail("NO_TRAINABLE_PARAMETERS", "nothing to train: attach or load a LoRA adapter (and, for PPO, a value head) first.");
  const int64_t N = static_cast<int64_t>(b.seqs.size());
  if (static_cast<int64_t>(b.mask.size()) != N) fail("ARGUMENT_INVALID", "the batch needs one loss mask per sequence.");
  const bool pg = lc.kind == LossKind::PG;
  if (pg && (b.advantages.size() != b.seqs.size() || b.old_logprobs.size() != b.seqs.size()))
    fail("ARGUMENT_INVALID", "the policy-gradient loss needs per-token advantages and old log-probs for every sequence.");
  const bool value = lc.vf_coef > 0;
  if (value && (!m.value_w.defined() || b.returns.size() != b.seqs.size() || b.old_values.size() != b.seqs.size()))
    fail("ARGUMENT_INVALID", "the value loss needs a value head and per-token returns and old values for every sequence.");
  // Per-token weights fixed for the whole batch.
  std::vector<int64_t> n(N, 0);
  int64_t total = 0, seqs_with_tokens = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (b.mask[i].size() != b.seqs[i].size()) fail("ARGUMENT_INVALID", "sequence " + std::to_string(i) + ": the loss mask must have one entry per token.");
    for (size_t t = 1; t < b.mask[i].size(); ++t) n[i] += b.mask[i][t] ? 1 : 0;
    total += n[i];
    seqs_with_tokens += n[i] > 0;
  }
  st.tokens = total;
  st.sequences = seqs_with_tokens;
  // The loss weights' denominators: this batch's counts, or the global batch's (data-parallel ranks).
  const int64_t w_tokens = to.norm_tokens > 0 ? to.norm_tokens : total;
  const int64_t w_seqs = to.norm_sequences > 0 ? to.norm_sequences : seqs_with_tokens;
  if (to.norm_tokens > 0 && (to.norm_tokens < total || to.norm_sequences < seqs_with_tokens))
    fail("ARGUMENT_INVALID", "normTokens/normSequences (" + std::to_string(to.norm_tokens) + "/" + std::to_string(to.norm_sequences) + ") are the global batch's counts and cannot be smaller than this batch's (" + std::to_string(total) + "/" + std::to_string(seqs_with_tokens) + ").");
  clear_grads(params);
  if (total == 0) {
    st.skipped = true;
    st.skip_reason = "no trained tokens in the batch (every loss mask is 0)";
    return st;
  }
  const auto dev = m.device();
  const int64_t mb = to.micro_batch > 0 ? to.micro_batch : N;
  double s_loss = 0, s_pg = 0, s_sft = 0, s_kl = 0, s_ent = 0, s_clip = 0, s_vl = 0, s_ratio = 0;
  at::AutoGradMode grad_on(true);
  for (int64_t s0 = 0; s0 < N; s0 += mb) {
    const int64_t s1 = std::min(N, s0 + mb), B = s1 - s0;
    int64_t T = 0;
    for (int64_t i = s0; i < s1; ++i) T = std::max<int64_t>(T, static_cast<int64_t>(b.seqs[i].size()));
    if (T < 2) continue;
    const auto li = at::TensorOptions().dtype(at::kLong);
    auto ids = at::zeros({B, T}, li), keys = at::zeros({B, T}, li);
    auto w = at::zeros({B, T - 1}, at::kFloat), temp = at::ones({B, 1, 1}, at::kFloat);
    {
      auto ia = ids.accessor<int64_t, 2>();
      auto ka = keys.accessor<int64_t, 2>();
      auto wa = w.accessor<float, 2>();
      auto ta = temp.accessor<float, 3>();
      for (int64_t i = s0; i < s1; ++i) {
        for (size_t t = 0; t < b.seqs[i].size(); ++t) {
          ia[i - s0][t] = b.seqs[i][t];
          ka[i - s0][t] = 1;
          if (t >= 1 && b.mask[i][t]) wa[i - s0][t - 1] = lc.token_level || !pg ? 1.f / w_tokens : 1.f / (w_seqs * n[i]);
        }
        if (!b.temperature.empty()) ta[i - s0][0][0] = b.temperature[i];
      }
    }
    auto positions = at::arange(T, li).unsqueeze(0).expand({B, T}).contiguous().to(dev);
    ids = ids.to(dev);
    keys = keys.to(dev);
    w = w.to(dev);
    temp = temp.to(dev);
    auto tgt = ids.narrow(1, 1, T - 1).unsqueeze(-1);  // [B, T-1, 1]
    at::Tensor adv, old_lp, ret, old_v, ref_lp;
    if (pg) {
      adv = pack(b.advantages, s0, s1, T, "advantages", N).to(dev);
      old_lp = pack(b.old_logprobs, s0, s1, T, "old_logprobs", N).to(dev);
    }
    if (value) {
      ret = pack(b.returns, s0, s1, T, "returns", N).to(dev);
      old_v = pack(b.old_values, s0, s1, T, "old_values", N).to(dev);
    }
    const int64_t V = m.config().vocab_size;
    const int64_t chunk = std::max<int64_t>(1, (int64_t(32) << 20) / std::max<int64_t>(B * V, 1));  // ~128 MB of float32 logits
    if (pg && lc.kl_coef > 0) {
      at::NoGradGuard ng;  // the reference policy: the frozen reference adapter, else the base weights
      auto hr = m.hidden(ids, positions, keys, nullptr, ForwardOptions{false, false, false, true});
      ref_lp = at::zeros({B, T - 1}, at::TensorOptions().dtype(at::kFloat).device(dev));
      for (int64_t c0 = 0; c0 < T - 1; c0 += chunk) {
        const int64_t c = std::min(chunk, T - 1 - c0);
        auto lp = at::log_softmax(m.logits(hr.narrow(1, c0, c)) / temp, -1);
        ref_lp.narrow(1, c0, c).copy_(lp.gather(-1, tgt.narrow(1, c0, c)).squeeze(-1));
      }
    }
    auto h = m.hidden(ids, positions, keys, nullptr, ForwardOptions{true, true, to.checkpoint});
    // Chunked head: the vocab projection and the loss run per time chunk on a detached copy of the
    // hidden states, each chunk's graph freed after its backward; the summed gradient then flows
    // into the decoder in one backward.
    auto hd = h.narrow(1, 0, T - 1).detach().requires_grad_(true);
    for (int64_t c0 = 0; c0 < T - 1; c0 += chunk) {
      const int64_t c = std::min(chunk, T - 1 - c0);
      auto wc = w.narrow(1, c0, c);
      auto logp = at::log_softmax(m.logits(hd.narrow(1, c0, c)) / temp, -1);  // [B, c, V]
      auto lp = logp.gather(-1, tgt.narrow(1, c0, c)).squeeze(-1);             // [B, c]
      at::Tensor loss;
      {
        at::NoGradGuard ng;
        auto ent = -(logp.exp() * logp).sum(-1);
        s_ent += (ent * wc).sum().item<double>();
      }
      if (!pg) {
        auto l = -(lp * wc).sum();
        s_sft += l.item<double>();
        loss = l;
      } else {
        auto a = adv.narrow(1, c0, c), olp = old_lp.narrow(1, c0, c);
        auto ratio = at::exp(lp - olp);
        auto s1v = ratio * a, s2v = at::clamp(ratio, 1 - lc.clip_low, 1 + lc.clip_high) * a;
        auto pgl = -at::min(s1v, s2v);
        loss = (pgl * wc).sum();
        {
          at::NoGradGuard ng;
          s_pg += loss.item<double>();
          s_clip += ((s2v < s1v).to(at::kFloat) * wc).sum().item<double>();
          s_ratio += (ratio * wc).sum().item<double>();
        }
        if (lc.kl_coef > 0) {
          auto d = ref_lp.narrow(1, c0, c) - lp;
          auto kl = lc.kl_estimator == 1 ? -d : at::exp(d) - d - 1;
          auto kll = (kl * wc).sum();
          s_kl += kll.item<double>();
          loss = loss + lc.kl_coef * kll;
        }
        if (lc.entropy_coef > 0) loss = loss + lc.entropy_coef * (at::sum(logp.exp() * logp, -1) * wc).sum();
      }
      if (value) {
        auto v = at::matmul(hd.narrow(1, c0, c).to(at::kFloat), m.value_w) + m.value_b;  // [B, c]
        auto ov = old_v.narrow(1, c0, c), r = ret.narrow(1, c0, c);
        auto vc = ov + at::clamp(v - ov, -lc.value_clip, lc.value_clip);
        auto vl = 0.5 * at::max((v - r).pow(2), (vc - r).pow(2));
        auto vll = (vl * wc).sum();
        s_vl += vll.item<double>();
        loss = loss + lc.vf_coef * vll;
      }
      s_loss += loss.item<double>();
      if (loss.requires_grad()) loss.backward();
    }
    if (hd.grad().defined() && h.requires_grad()) h.narrow(1, 0, T - 1).backward(hd.grad());
  }
  st.loss = s_loss;
  st.sft_loss = s_sft;
  st.pg_loss = s_pg;
  st.kl = s_kl;
  st.value_loss = s_vl;
  // Token-weighted means of the diagnostics (weights sum to 1 over the batch).
  st.entropy = s_ent;
  st.clip_frac = s_clip;
  st.ratio = s_ratio;
  if (to.update)
    apply_gradients(m, opt, oc, st);
  else
    st.grad_norm = grad_norm(params);
  return st;
}

void apply_gradients(Qwen3Model& m, AdamW& opt, const OptimConfig& oc, TrainStats& st) {
  auto params = trainable(m);
  // Gradient norm over every trainable tensor; a NaN/inf gradient skips the update.
  st.grad_norm = grad_norm(params);
  if (!std::isfinite(st.grad_norm) || !std::isfinite(st.loss)) {
    st.skipped = true;
    st.skip_reason = !std::isfinite(st.loss) ? "the loss is not finite (NaN or inf): the update was skipped" : "the gradient is not finite (NaN or inf): the update was skipped";
    clear_grads(params);
    return;
  }
  if (oc.max_grad_norm > 0 && st.grad_norm > oc.max_grad_norm) {
    at::NoGradGuard ng;
    const double coef = oc.max_grad_norm / (st.grad_norm + 1e-6);
    for (const auto& [name, p] : params) {
      (void)name;
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }
  opt.update(params, oc);
  clear_grads(params);
}

at::Tensor flat_gradients(const Qwen3Model& m) {
  std::vector<at::Tensor> parts;
  for (const auto& [name, p] : trainable(m)) {
    (void)name;
    parts.push_back(p.grad().defined() ? p.grad().detach().to(at::kFloat).reshape({-1}) : at::zeros({p.numel()}, p.options().dtype(at::kFloat)));
  }
  if (parts.empty()) fail("NO_TRAINABLE_PARAMETERS", "no trainable tensors: attach or load a LoRA adapter first.");
  return at::cat(parts);
}

void set_flat_gradients(Qwen3Model& m, const at::Tensor& flat) {
  auto params = trainable(m);
  int64_t n = 0;
  for (const auto& [name, p] : params) n += p.numel();
  if (flat.numel() != n) fail("ARGUMENT_INVALID", "gradients: expected " + std::to_string(n) + " values (every trainable tensor, flattened in order), found " + std::to_string(flat.numel()) + ".");
  int64_t off = 0;
  for (const auto& [name, p] : params) {
    (void)name;
    p.mutable_grad() = flat.narrow(0, off, p.numel()).to(p.device(), p.scalar_type()).view(p.sizes()).clone();
    off += p.numel();
  }
}

}  // namespace slm
