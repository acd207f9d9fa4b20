// `losses`: the training losses of core/losses.h on small typed arrays, synchronously, for tests that
// check them against hand-computed values. Per-token inputs are one row of n target-aligned values
// (a [1, n] tensor); each call returns the loss and its gradient with respect to the first input.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <utility>

#include "addon/convert.h"
#include "addon/errors.h"
#include "core/losses.h"

namespace slm_addon {

namespace {

Napi::Object arg(const Napi::CallbackInfo& info, const char* what) {
  if (!info[0].IsObject()) throw_error(info.Env(), "ARGUMENT_INVALID", std::string("losses.") + what + " expects a request object.");
  return info[0].As<Napi::Object>();
}

// A Float32Array field as a [1, n] tensor (n checked against `n` when n >= 0).
at::Tensor row(Napi::Env env, const Napi::Object& o, const char* k, int64_t n) {
  auto v = float32s(env, o.Get(k), k);
  if (n >= 0 && static_cast<int64_t>(v.size()) != n)
    throw_error(env, "ARGUMENT_INVALID",
                std::string("losses: '") + k + "' must have " + std::to_string(n) + " values (one per token), found " +
                    std::to_string(v.size()) + ".");
  return at::tensor(v, at::kFloat).view({1, static_cast<int64_t>(v.size())});
}

double number(Napi::Env env, const Napi::Object& o, const char* k) {
  auto v = o.Get(k);
  if (!v.IsNumber()) throw_error(env, "ARGUMENT_INVALID", std::string("losses: '") + k + "' must be a number.");
  return v.As<Napi::Number>().DoubleValue();
}

Napi::Float32Array to_js(Napi::Env env, const at::Tensor& t) {
  auto c = t.defined() ? t.detach().to(at::kFloat).contiguous() : at::zeros({0}, at::kFloat);
  auto a = Napi::Float32Array::New(env, c.numel());
  if (c.numel()) std::memcpy(a.Data(), c.data_ptr<float>(), c.numel() * sizeof(float));
  return a;
}

// {loss, grad}: the loss, and d loss / d x.
Napi::Object result(Napi::Env env, at::Tensor loss, const at::Tensor& x) {
  loss.backward();
  auto o = Napi::Object::New(env);
  o.Set("loss", loss.item<double>());
  o.Set("grad", to_js(env, x.grad()));
  return o;
}

// weights({mask: Uint8Array, lengths: Int32Array, norm: 'token' | 'sequence', tokens?, sequences?}) ->
// Float32Array aligned with mask (entry 0 of each row is 0): the per-token loss weights.
Napi::Value Weights(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "weights");
  auto flat = typed_vector<uint8_t, napi_uint8_array>(env, o.Get("mask"), "mask");
  auto lengths = int32s(env, o.Get("lengths"), "lengths");
  std::vector<std::vector<uint8_t>> mask;
  size_t off = 0;
  int64_t T = 0, tokens = 0, sequences = 0;
  for (auto n : lengths) {
    if (n < 0 || off + n > flat.size()) throw_error(env, "ARGUMENT_INVALID", "losses.weights: lengths do not add up to the mask's length.");
    mask.emplace_back(flat.begin() + off, flat.begin() + off + n);
    off += n;
    T = std::max<int64_t>(T, n);
    int64_t k = 0;
    for (int32_t t = 1; t < n; ++t) k += mask.back()[t] ? 1 : 0;
    tokens += k;
    sequences += k > 0;
  }
  if (off != flat.size()) throw_error(env, "ARGUMENT_INVALID", "losses.weights: lengths do not add up to the mask's length.");
  auto norm = str_field(env, o, "norm", "");
  if (norm != "token" && norm != "sequence")
    throw_error(env, "ARGUMENT_INVALID", "losses.weights: norm must be 'token' or 'sequence', found '" + norm + "'.");
  tokens = int_field(env, o, "tokens", tokens);
  sequences = int_field(env, o, "sequences", sequences);
  auto w = slm::loss_weights(mask, 0, static_cast<int64_t>(mask.size()), T,
                             norm == "token" ? slm::LossNorm::Token : slm::LossNorm::Sequence, tokens, sequences);
  std::vector<float> out(flat.size(), 0.f);
  auto wa = w.accessor<float, 2>();
  off = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    for (size_t t = 1; t < mask[i].size(); ++t) out[off + t] = wa[i][t - 1];
    off += mask[i].size();
  }
  return to_typed(env, out);
}

// sft({logprobs, weights}) -> {loss, grad}
Napi::Value Sft(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "sft");
  at::AutoGradMode on(true);
  auto lp = row(env, o, "logprobs", -1).requires_grad_(true);
  return result(env, slm::sft_loss(lp, row(env, o, "weights", lp.size(1))), lp);
}

// policy({logprobs, oldLogprobs, advantages, weights, clipLow, clipHigh}) -> {loss, grad, clipped, ratio}
Napi::Value Policy(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "policy");
  at::AutoGradMode on(true);
  auto lp = row(env, o, "logprobs", -1).requires_grad_(true);
  const int64_t n = lp.size(1);
  auto p = slm::policy_loss(lp, row(env, o, "oldLogprobs", n), row(env, o, "advantages", n), row(env, o, "weights", n),
                            number(env, o, "clipLow"), number(env, o, "clipHigh"));
  auto r = result(env, p.loss, lp);
  r.Set("clipped", p.clipped.item<double>());
  r.Set("ratio", p.ratio.item<double>());
  return r;
}

// kl({logprobs, refLogprobs, weights, estimator: 1 | 3}) -> {loss, grad}
Napi::Value Kl(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "kl");
  const double est = number(env, o, "estimator");
  if (est != 1 && est != 3) throw_error(env, "ARGUMENT_INVALID", "losses.kl: estimator must be 1 or 3.");
  at::AutoGradMode on(true);
  auto lp = row(env, o, "logprobs", -1).requires_grad_(true);
  const int64_t n = lp.size(1);
  return result(env, slm::kl_penalty(lp, row(env, o, "refLogprobs", n), row(env, o, "weights", n), static_cast<int>(est)), lp);
}

// {logits (n x vocab values), vocab, temperature?} -> logits [1, n, vocab] (a copy that takes a
// gradient) and the temperature as [1, 1, 1].
std::pair<at::Tensor, at::Tensor> vocab_rows(Napi::Env env, const Napi::Object& o, const char* what) {
  const int64_t V = int_field(env, o, "vocab", 0, true);
  auto flat = row(env, o, "logits", -1);
  if (V <= 0 || flat.size(1) % V != 0)
    throw_error(env, "ARGUMENT_INVALID", std::string("losses.") + what + ": logits must hold n x vocab values.");
  return {flat.view({1, flat.size(1) / V, V}).clone().requires_grad_(true),
          at::full({1, 1, 1}, num_field(env, o, "temperature", 1.0), at::kFloat)};
}

// entropy({logits, vocab, weights, temperature?}) -> {loss (the bonus term), grad (d bonus / d logits), entropy (weighted), logprobs}
Napi::Value Entropy(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "entropy");
  at::AutoGradMode on(true);
  auto [logits, temp] = vocab_rows(env, o, "entropy");
  const int64_t n = logits.size(1);
  auto w = row(env, o, "weights", n);
  auto logp = slm::token_logprobs(logits, temp);
  double ent;
  {
    at::NoGradGuard ng;
    ent = (slm::entropy(logp) * w).sum().item<double>();
  }
  auto lp_copy = logp.detach().clone();
  auto r = result(env, slm::entropy_bonus(logp, w), logits);
  r.Set("entropy", ent);
  r.Set("logprobs", to_js(env, lp_copy));
  return r;
}

// tokenStats({logits, vocab, targets, temperature?, gradLogprobs?, gradEntropy?}) -> {logprobs, entropy,
// grad}: the train step's fused head (token_stats): each position's target log-prob and entropy, and
// d (sum gradLogprobs * logprobs + sum gradEntropy * entropy) / d logits; kernelRows: the rows the CPU
// kernel ran each way in this call (0: ATen's operations).
Napi::Value TokenStatsJs(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "tokenStats");
  at::AutoGradMode on(true);
  auto [logits, temp] = vocab_rows(env, o, "tokenStats");
  const int64_t n = logits.size(1), V = logits.size(2);
  auto ids = int32s(env, o.Get("targets"), "targets");
  if (static_cast<int64_t>(ids.size()) != n)
    throw_error(env, "ARGUMENT_INVALID",
                "losses.tokenStats: 'targets' must have one id per position (" + std::to_string(n) + "), found " +
                    std::to_string(ids.size()) + ".");
  for (auto id : ids)
    if (id < 0 || id >= V)
      throw_error(env, "ARGUMENT_INVALID",
                  "losses.tokenStats: target id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ").");
  auto targets = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong).view({1, n, 1});
  const auto before = slm::cpu_head_kernel_rows();
  auto st = slm::token_stats(logits, temp, targets);
  auto loss = at::zeros({}, at::kFloat);
  if (o.Has("gradLogprobs")) loss = loss + (st.lp * row(env, o, "gradLogprobs", n)).sum();
  if (o.Has("gradEntropy")) loss = loss + (st.ent * row(env, o, "gradEntropy", n)).sum();
  auto r = Napi::Object::New(env);
  r.Set("logprobs", to_js(env, st.lp));
  r.Set("entropy", to_js(env, st.ent));
  if (loss.requires_grad()) loss.backward();
  r.Set("grad", to_js(env, logits.grad()));
  const auto after = slm::cpu_head_kernel_rows();
  auto k = Napi::Object::New(env);
  k.Set("stats", Napi::Number::New(env, static_cast<double>(after.stats - before.stats)));
  k.Set("grad", Napi::Number::New(env, static_cast<double>(after.grad - before.grad)));
  r.Set("kernelRows", k);
  return r;
}

// value({values, oldValues, returns, weights, valueClip}) -> {loss, grad}
Napi::Value ValueLoss(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = arg(info, "value");
  at::AutoGradMode on(true);
  auto v = row(env, o, "values", -1).requires_grad_(true);
  const int64_t n = v.size(1);
  return result(
      env,
      slm::value_loss(v, row(env, o, "oldValues", n), row(env, o, "returns", n), row(env, o, "weights", n), number(env, o, "valueClip")),
      v);
}

}  // namespace

Napi::Object Losses(Napi::Env env) {
  auto o = Napi::Object::New(env);
  o.Set("weights", Napi::Function::New(env, Weights, "weights"));
  o.Set("sft", Napi::Function::New(env, Sft, "sft"));
  o.Set("policy", Napi::Function::New(env, Policy, "policy"));
  o.Set("kl", Napi::Function::New(env, Kl, "kl"));
  o.Set("entropy", Napi::Function::New(env, Entropy, "entropy"));
  o.Set("value", Napi::Function::New(env, ValueLoss, "value"));
  o.Set("tokenStats", Napi::Function::New(env, TokenStatsJs, "tokenStats"));
  return o;
}

}  // namespace slm_addon
