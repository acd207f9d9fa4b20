// `linear`, `sample`, `attention`, `norm` and `siluMul`: the engine's CPU kernels (core/cpu_gemm.h, core/sampler.h,
// core/cpu_attention.h, core/cpu_norm.h) on small typed arrays, synchronously, for tests and benchmarks that compare
// them with ATen's path and with hand-computed values. Not used by training or generation.
#include <napi.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "addon/errors.h"
#include "core/cpu_gemm.h"
#include "core/cpu_norm.h"
#include "core/qwen3.h"
#include "core/sampler.h"

namespace slm_addon {

// y [M, N] = x [M, K] · w [N, K]ᵀ through the model's linear layer (the small-row kernel when it
// applies and is allowed, else at::linear), in float32 or bfloat16 (inputs rounded to it, output
// returned as float32). head: the vocabulary head's call instead (float32 out into a reused buffer).
// For tests and benchmarks of the kernels.
Napi::Value Linear(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "linear expects { x, w, m, n, k, dtype }.");
  auto o = info[0].As<Napi::Object>();
  if (!o.Get("m").IsNumber() || !o.Get("n").IsNumber() || !o.Get("k").IsNumber() || !o.Get("x").IsTypedArray() ||
      !o.Get("w").IsTypedArray())
    throw_error(env, "ARGUMENT_INVALID", "linear expects numbers m, n, k and Float32Arrays x, w.");
  const int64_t M = o.Get("m").As<Napi::Number>().Int64Value(), N = o.Get("n").As<Napi::Number>().Int64Value(),
                K = o.Get("k").As<Napi::Number>().Int64Value();
  auto xs = o.Get("x").As<Napi::Float32Array>(), ws = o.Get("w").As<Napi::Float32Array>();
  if (M < 1 || N < 1 || K < 1 || static_cast<int64_t>(xs.ElementLength()) != M * K || static_cast<int64_t>(ws.ElementLength()) != N * K)
    throw_error(env, "ARGUMENT_INVALID", "linear: x must hold m*k and w n*k floats, with m, n, k >= 1.");
  const std::string dt = o.Get("dtype").IsString() ? o.Get("dtype").As<Napi::String>().Utf8Value() : "float32";
  if (dt != "float32" && dt != "bfloat16")
    throw_error(env, "ARGUMENT_INVALID", "linear: dtype must be float32 or bfloat16, found '" + dt + "'.");
  const auto st = dt == "bfloat16" ? at::kBFloat16 : at::kFloat;
  at::NoGradGuard ng;
  auto x = at::from_blob(xs.Data(), {M, K}, at::kFloat).to(st);
  auto w = at::from_blob(ws.Data(), {N, K}, at::kFloat).to(st);
  at::Tensor y;
  if (o.Get("head").ToBoolean().Value()) {
    // The vocabulary head's path in a decode loop: float32 out, into a reused buffer (here one two
    // elements longer than needed and full of NaN), which the result must be a view of.
    auto buf = at::full({M * N + 2}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
    y = slm::vocab_logits(x, w, /*kernels=*/true, buf);
    if (y.data_ptr() != buf.data_ptr() && slm::cpu_small_linear(x, w, /*float_out=*/true).defined())  // a kernel applies
      throw_error(env, "NATIVE_ERROR", "linear: the head path did not write into the buffer it was given.");
  } else {
    slm::Linear lin{w, at::Tensor(), nullptr, nullptr};
    slm::ForwardOptions fo;
    fo.kernels = true;  // generation's path: the kernel when it applies and is allowed
    y = lin.forward(x, fo);
  }
  y = y.to(at::kFloat).contiguous();
  auto out = Napi::Float32Array::New(env, static_cast<size_t>(M * N));
  std::memcpy(out.Data(), y.data_ptr<float>(), sizeof(float) * M * N);
  return out;
}

// One sampling step over given logits [rows, vocab] (core/sampler.h): the fused CPU path, or ATen's
// tensor path when the CPU kernels are off. For tests and benchmarks.
Napi::Value Sample(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject())
    throw_error(env, "ARGUMENT_INVALID", "sample expects { logits, rows, vocab, temperature, u, topK?, topP?, topN? }.");
  auto o = info[0].As<Napi::Object>();
  if (!o.Get("logits").IsTypedArray() || !o.Get("rows").IsNumber() || !o.Get("vocab").IsNumber())
    throw_error(env, "ARGUMENT_INVALID", "sample expects a Float32Array logits and numbers rows, vocab.");
  auto lg = o.Get("logits").As<Napi::Float32Array>();
  const int64_t B = o.Get("rows").As<Napi::Number>().Int64Value(), V = o.Get("vocab").As<Napi::Number>().Int64Value();
  auto nums = [&](const char* key) {
    std::vector<float> v;
    if (!o.Has(key) || !o.Get(key).IsArray()) return v;
    auto a = o.Get(key).As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) v.push_back(a.Get(i).As<Napi::Number>().FloatValue());
    return v;
  };
  auto temps = nums("temperature"), us = nums("u"), tops = nums("topP");
  if (B < 1 || V < 1 || static_cast<int64_t>(lg.ElementLength()) != B * V || static_cast<int64_t>(temps.size()) != B ||
      static_cast<int64_t>(us.size()) != B || !(tops.empty() || static_cast<int64_t>(tops.size()) == B))
    throw_error(env, "ARGUMENT_INVALID",
                "sample: logits must hold rows*vocab floats, temperature and u one number per row, topP none or one per row.");
  if (tops.empty()) tops.assign(B, 1.f);
  const int64_t top_k = o.Has("topK") ? o.Get("topK").As<Napi::Number>().Int64Value() : 0;
  const int64_t top_n = o.Has("topN") ? o.Get("topN").As<Napi::Number>().Int64Value() : 0;
  at::NoGradGuard ng;
  auto logits = at::from_blob(lg.Data(), {B, V}, at::kFloat);
  auto s = slm::sample(logits, temps, top_k, tops, at::tensor(us, at::kFloat), top_n);
  auto tok = s.tokens.to(at::kLong).contiguous();
  auto lp = s.logprobs.to(at::kFloat).contiguous();
  auto r = Napi::Object::New(env);
  auto ta = Napi::Array::New(env, B), la = Napi::Array::New(env, B);
  for (int64_t b = 0; b < B; ++b) {
    ta.Set(static_cast<uint32_t>(b), Napi::Number::New(env, static_cast<double>(tok.data_ptr<int64_t>()[b])));
    la.Set(static_cast<uint32_t>(b), Napi::Number::New(env, lp.data_ptr<float>()[b]));
  }
  r.Set("tokens", ta);
  r.Set("logprobs", la);
  if (top_n > 0) {
    auto ti = s.top_ids.to(at::kLong).contiguous();
    auto tl = s.top_logprobs.to(at::kFloat).contiguous();
    auto ia = Napi::Array::New(env, ti.numel()), lpa = Napi::Array::New(env, tl.numel());
    for (int64_t i = 0; i < ti.numel(); ++i) {
      ia.Set(static_cast<uint32_t>(i), Napi::Number::New(env, static_cast<double>(ti.data_ptr<int64_t>()[i])));
      lpa.Set(static_cast<uint32_t>(i), Napi::Number::New(env, tl.data_ptr<float>()[i]));
    }
    r.Set("topIds", ia);
    r.Set("topLogprobs", lpa);
  }
  return r;
}

// Attention through the model's grouped_attention (core/qwen3.h): q [b, nq, t, d], k/v [b, nkv,
// capacity, d] of which the first s positions are used (a KV cache's view), mask [b, t, s] additive;
// returns [b, nq, t, d] as float32. The fused CPU kernel when it applies and is allowed, else
// ATen's operations. For tests and benchmarks of the kernel.
Napi::Value Attention(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject())
    throw_error(env, "ARGUMENT_INVALID", "attention expects { q, k, v, mask, b, nq, nkv, s, d, t?, capacity?, dtype?, prefix? }.");
  auto o = info[0].As<Napi::Object>();
  auto dim = [&](const char* key, int64_t dflt) {
    auto x = o.Get(key);
    if (x.IsUndefined() && dflt > 0) return dflt;
    if (!x.IsNumber() || x.As<Napi::Number>().Int64Value() < 1)
      throw_error(env, "ARGUMENT_INVALID", std::string("attention: '") + key + "' must be a positive integer.");
    return x.As<Napi::Number>().Int64Value();
  };
  const int64_t B = dim("b", 0), nq = dim("nq", 0), nkv = dim("nkv", 0), S = dim("s", 0), D = dim("d", 0), T = dim("t", 1),
                C = dim("capacity", S);
  if (nq % nkv != 0 || C < S) throw_error(env, "ARGUMENT_INVALID", "attention: nq must be a multiple of nkv and capacity >= s.");
  auto floats = [&](const char* key, int64_t n) {
    auto x = o.Get(key);
    if (!x.IsTypedArray() || x.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
        static_cast<int64_t>(x.As<Napi::Float32Array>().ElementLength()) != n)
      throw_error(env, "ARGUMENT_INVALID",
                  std::string("attention: '") + key + "' must be a Float32Array of " + std::to_string(n) + " values.");
    return at::from_blob(x.As<Napi::Float32Array>().Data(), {n}, at::kFloat).clone();
  };
  const std::string dt = o.Get("dtype").IsString() ? o.Get("dtype").As<Napi::String>().Utf8Value() : "float32";
  if (dt != "float32" && dt != "bfloat16")
    throw_error(env, "ARGUMENT_INVALID", "attention: dtype must be float32 or bfloat16, found '" + dt + "'.");
  const auto st = dt == "bfloat16" ? at::kBFloat16 : at::kFloat;
  at::NoGradGuard ng;
  auto q = floats("q", B * nq * T * D).view({B, nq, T, D}).to(st);
  auto k = floats("k", B * nkv * C * D).view({B, nkv, C, D}).to(st).narrow(2, 0, S);
  auto v = floats("v", B * nkv * C * D).view({B, nkv, C, D}).to(st).narrow(2, 0, S);
  auto mask = floats("mask", B * T * S).view({B, 1, T, S});
  // prefix P: keys [0, P) are row 0's, shared by every row (a cascade KV cache); each row's own keys
  // at those positions are not read.
  const int64_t P = o.Get("prefix").IsUndefined() ? 0 : dim("prefix", 0);
  if (P >= S) throw_error(env, "ARGUMENT_INVALID", "attention: 'prefix' must be smaller than s.");
  auto y = (P > 0 ? slm::grouped_attention(q, k.narrow(2, P, S - P), v.narrow(2, P, S - P), mask, true, k.narrow(0, 0, 1).narrow(2, 0, P),
                                           v.narrow(0, 0, 1).narrow(2, 0, P))
                  : slm::grouped_attention(q, k, v, mask, true))
               .to(at::kFloat)
               .contiguous();
  auto out = Napi::Float32Array::New(env, static_cast<size_t>(B * nq * T * D));
  std::memcpy(out.Data(), y.data_ptr<float>(), sizeof(float) * B * nq * T * D);
  return out;
}

// Generation's RMSNorm, or per-head RMSNorm + RoPE (core/cpu_norm.h): x [rows, positions, heads, d]
// (positions default 1: a decode step); w [d] (optional with cos/sin: RoPE alone); cos/sin [rows,
// positions, d] (absent: RMSNorm alone over rows x positions rows, heads 1). The
// kernel when the CPU kernels are on, ATen's operations (rms_norm_aten, rope_aten) when they are off;
// float32 or bfloat16 (inputs rounded to it). Returns { y: the result as float32, kernel: whether the
// kernel ran }. For tests.
Napi::Value Norm(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "norm expects { x, w, rows, positions, heads, d, cos, sin, dtype }.");
  auto o = info[0].As<Napi::Object>();
  const auto dim = [&](const char* key) {
    auto x = o.Get(key);
    if (!x.IsNumber() || x.As<Napi::Number>().Int64Value() < 1)
      throw_error(env, "ARGUMENT_INVALID", std::string("norm: '") + key + "' must be a positive integer.");
    return x.As<Napi::Number>().Int64Value();
  };
  const int64_t R = dim("rows"), T = o.Get("positions").IsUndefined() ? 1 : dim("positions"),
                n = o.Get("heads").IsUndefined() ? 1 : dim("heads"), D = dim("d");
  const std::string dt = o.Get("dtype").IsString() ? o.Get("dtype").As<Napi::String>().Utf8Value() : "float32";
  if (dt != "float32" && dt != "bfloat16")
    throw_error(env, "ARGUMENT_INVALID", "norm: dtype must be float32 or bfloat16, found '" + dt + "'.");
  const auto st = dt == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const auto floats = [&](const char* key, int64_t len) {
    auto x = o.Get(key);
    if (x.IsUndefined()) return at::Tensor();
    if (!x.IsTypedArray() || x.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
        static_cast<int64_t>(x.As<Napi::Float32Array>().ElementLength()) != len)
      throw_error(env, "ARGUMENT_INVALID",
                  std::string("norm: '") + key + "' must be a Float32Array of " + std::to_string(len) + " values.");
    return at::from_blob(x.As<Napi::Float32Array>().Data(), {len}, at::kFloat).to(st);
  };
  at::NoGradGuard ng;
  const auto x = floats("x", R * T * n * D), w = floats("w", D), c = floats("cos", R * T * D), s = floats("sin", R * T * D);
  if (!x.defined() || c.defined() != s.defined() || (!c.defined() && (!w.defined() || n != 1)))
    throw_error(env, "ARGUMENT_INVALID", "norm: give x and w (RMSNorm, heads 1), or x, cos and sin (and w for the per-head norm).");
  const double eps = 1e-6;
  at::Tensor y;
  bool kernel = false;  // whether the kernel ran (else ATen's operations)
  if (!c.defined()) {
    const auto xs = x.view({R, T, D});
    y = slm::cpu_rms_norm(xs, w, eps);
    kernel = y.defined();
    if (!kernel) y = slm::rms_norm_aten(xs, w, eps);
  } else {
    const auto xs = x.view({R, T, n, D}), cs = c.view({R, T, 1, D}), ss = s.view({R, T, 1, D});
    y = slm::cpu_norm_rope(xs, w, cs, ss, eps);
    kernel = y.defined();
    if (!kernel) y = slm::rope_aten(w.defined() ? slm::rms_norm_aten(xs, w, eps) : xs, cs, ss);
  }
  y = y.to(at::kFloat).contiguous();
  auto out = Napi::Float32Array::New(env, static_cast<size_t>(R * T * n * D));
  std::memcpy(out.Data(), y.data_ptr<float>(), sizeof(float) * R * T * n * D);
  auto r = Napi::Object::New(env);
  r.Set("y", out);
  r.Set("kernel", Napi::Boolean::New(env, kernel));
  return r;
}

// The MLP's gate of a decode step, silu(g) * u, g and u [rows, n] (core/cpu_norm.h): the kernel when
// the CPU kernels are on, ATen's at::silu(g) * u when they are off; float32 or bfloat16 (inputs rounded
// to it). Returns { y (float32), kernel: whether the kernel ran }. For tests.
Napi::Value SiluMul(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "siluMul expects { g, u, rows, n, dtype }.");
  auto o = info[0].As<Napi::Object>();
  for (const char* key : {"rows", "n"})
    if (!o.Get(key).IsNumber() || o.Get(key).As<Napi::Number>().Int64Value() < 1)
      throw_error(env, "ARGUMENT_INVALID", std::string("siluMul: '") + key + "' must be a positive integer.");
  const int64_t R = o.Get("rows").As<Napi::Number>().Int64Value(), n = o.Get("n").As<Napi::Number>().Int64Value();
  const std::string dt = o.Get("dtype").IsString() ? o.Get("dtype").As<Napi::String>().Utf8Value() : "float32";
  if (dt != "float32" && dt != "bfloat16")
    throw_error(env, "ARGUMENT_INVALID", "siluMul: dtype must be float32 or bfloat16, found '" + dt + "'.");
  const auto st = dt == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const auto floats = [&](const char* key) {
    auto x = o.Get(key);
    if (!x.IsTypedArray() || x.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
        static_cast<int64_t>(x.As<Napi::Float32Array>().ElementLength()) != R * n)
      throw_error(env, "ARGUMENT_INVALID", std::string("siluMul: '") + key + "' must be a Float32Array of rows*n values.");
    return at::from_blob(x.As<Napi::Float32Array>().Data(), {R, 1, n}, at::kFloat).to(st);
  };
  at::NoGradGuard ng;
  const auto g = floats("g"), u = floats("u");
  auto y = slm::cpu_silu_mul(g, u);
  const bool kernel = y.defined();
  if (!kernel) y = at::silu(g) * u;
  y = y.to(at::kFloat).contiguous();
  auto out = Napi::Float32Array::New(env, static_cast<size_t>(R * n));
  std::memcpy(out.Data(), y.data_ptr<float>(), sizeof(float) * R * n);
  auto r = Napi::Object::New(env);
  r.Set("y", out);
  r.Set("kernel", Napi::Boolean::New(env, kernel));
  return r;
}

}  // namespace slm_addon
