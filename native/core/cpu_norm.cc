// RMSNorm and RoPE of a decode step on the CPU (see cpu_norm.h).
#include "core/cpu_norm.h"

#include "core/cpu_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace slm {

namespace {

template <class T>
inline float f32(T v) {
  return static_cast<float>(v);
}
// The value as the dtype holds it (bfloat16: rounded to nearest even; float32: unchanged).
template <class T>
inline float rounded(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// y = w * T(x * rsqrt(mean(x^2) + eps)), as Qwen3Model::rms_norm computes it; y may alias x.
template <class T>
void norm_row(const T* x, const T* w, float* y, int64_t H, float eps) {
  float ss = 0;
  for (int64_t i = 0; i < H; ++i) ss += f32(x[i]) * f32(x[i]);
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t i = 0; i < H; ++i) y[i] = rounded<T>(f32(w[i]) * rounded<T>(f32(x[i]) * inv));
}

template <class T>
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& w, float eps) {
  const int64_t H = x.size(-1), rows = x.numel() / H;
  auto y = at::empty_like(x);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  // Rows split between the threads (each row's arithmetic unchanged): ~4k elements per task at least,
  // so a single row or two stays on one thread.
  at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / H), [&](int64_t r0, int64_t r1) {
    std::vector<float> tmp(H);
    for (int64_t r = r0; r < r1; ++r) {
      norm_row(xp + r * H, wp, tmp.data(), H, eps);
      for (int64_t i = 0; i < H; ++i) yp[r * H + i] = static_cast<T>(tmp[i]);
    }
  });
  return y;
}

template <class T>
at::Tensor norm_rope_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin, float eps) {
  const int64_t B = x.size(0), n = x.size(2), D = x.size(3), half = D / 2;
  auto y = at::empty_like(x);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.defined() ? w.data_ptr<T>() : nullptr;
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, B * n, std::max<int64_t>(1, 4096 / D), [&](int64_t r0, int64_t r1) {
    std::vector<float> h(D);
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t b = row / n, j = row % n;
      const T* xr = xp + (b * n + j) * D;
      if (wp)
        norm_row(xr, wp, h.data(), D, eps);
      else
        for (int64_t i = 0; i < D; ++i) h[i] = f32(xr[i]);
      const T* c = cp + b * D;
      const T* s = sp + b * D;
      T* out = yp + (b * n + j) * D;
      // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[half:], x[:half]); each product rounded as ATen rounds it.
      for (int64_t i = 0; i < D; ++i) {
        const float rot = i < half ? -h[i + half] : h[i - half];
        out[i] = static_cast<T>(rounded<T>(h[i] * f32(c[i])) + rounded<T>(rot * f32(s[i])));
      }
    }
  });
  return y;
}

bool usable(const at::Tensor& x) {
  if (!cpu_kernels_enabled() || !x.device().is_cpu() || !x.is_contiguous()) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  return !(at::GradMode::is_enabled() && x.requires_grad());
}

bool same(const at::Tensor& a, const at::Tensor& x) {
  return a.defined() && a.scalar_type() == x.scalar_type() && a.device() == x.device() && a.is_contiguous() &&
         !(at::GradMode::is_enabled() && a.requires_grad());
}

}  // namespace

at::Tensor cpu_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!usable(x) || x.dim() < 1 || !same(w, x) || w.dim() != 1 || w.size(0) != x.size(-1)) return {};
  const float e = static_cast<float>(eps);
  return x.scalar_type() == at::kFloat ? rms_norm_rows<float>(x, w, e) : rms_norm_rows<c10::BFloat16>(x, w, e);
}

at::Tensor cpu_norm_rope(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin, double eps) {
  if (!usable(x) || x.dim() != 4 || x.size(1) != 1 || x.size(3) % 2 != 0) return {};
  const int64_t B = x.size(0), D = x.size(3);
  if (w.defined() && (!same(w, x) || w.dim() != 1 || w.size(0) != D)) return {};
  for (const auto* t : {&cos, &sin})
    if (!same(*t, x) || t->numel() != B * D || t->size(0) != B || t->size(-1) != D) return {};
  const float e = static_cast<float>(eps);
  return x.scalar_type() == at::kFloat ? norm_rope_rows<float>(x, w, cos, sin, e) : norm_rope_rows<c10::BFloat16>(x, w, cos, sin, e);
}

}  // namespace slm
