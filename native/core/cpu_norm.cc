// RMSNorm, RoPE and the SiLU gate of generation on the CPU (see cpu_norm.h).
#include "core/cpu_norm.h"

#include "core/cpu_gemm.h"
#include "core/cpu_isa.h"
#include "core/cpu_vec.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

namespace slm {

namespace {

template <class T>
inline float f32(T v) {
  return static_cast<float>(v);
}
// The value as the dtype holds it (bfloat16: rounded to nearest even; float32: unchanged, but kept as
// a value of its own, so that where FMA is allowed the compiler does not fuse the product it came from
// into the next addition: GCC contracts a*b + c by default, one rounding fewer than ATen's).
template <class T>
inline float rounded(float v) {
  if constexpr (std::is_same_v<T, float>) {
#if defined(__x86_64__) && defined(__GNUC__)
    __asm__("" : "+x"(v));
#endif
    return v;
  } else {
    return static_cast<float>(static_cast<T>(v));
  }
}

// y = w * T(x * rsqrt(mean(x^2) + eps)), as Qwen3Model::rms_norm computes it; y may alias x.
template <class T>
void norm_row(const T* x, const T* w, float* y, int64_t H, float eps) {
  float ss = 0;
  for (int64_t i = 0; i < H; ++i) ss += f32(x[i]) * f32(x[i]);
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t i = 0; i < H; ++i) y[i] = rounded<T>(f32(w[i]) * rounded<T>(f32(x[i]) * inv));
}

// The scalar rows (no vector kernels: SLM_TRAIN_CPU_ISA=none, or a CPU without AVX2).
template <class T>
void rms_norm_row_scalar(const T* x, const T* w, T* y, int64_t H, float eps, float* h) {
  norm_row(x, w, h, H, eps);
  for (int64_t i = 0; i < H; ++i) y[i] = static_cast<T>(h[i]);
}

template <class T>
void norm_rope_row_scalar(const T* x, const T* w, const T* c, const T* s, T* y, int64_t D, float eps, float* h) {
  const int64_t half = D / 2;
  if (w)
    norm_row(x, w, h, D, eps);
  else
    for (int64_t i = 0; i < D; ++i) h[i] = f32(x[i]);
  // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[half:], x[:half]); each product rounded as ATen rounds it.
  for (int64_t i = 0; i < D; ++i) {
    const float rot = i < half ? -h[i + half] : h[i - half];
    y[i] = static_cast<T>(rounded<T>(h[i] * f32(c[i])) + rounded<T>(rot * f32(s[i])));
  }
}

template <class T>
void silu_mul_row_scalar(const T* g, const T* u, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = f32(g[i]);
    y[i] = static_cast<T>(rounded<T>(x / (1.f + std::exp(-x))) * f32(u[i]));
  }
}

}  // namespace

// The vector rows, once per instruction set (core/simd.h).
#ifdef SLM_CPU_VEC_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
namespace n512 {
using V = simd::V16;
#include "core/cpu_norm_impl.h"
}  // namespace n512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace n256 {
using V = simd::V8;
#include "core/cpu_norm_impl.h"
}  // namespace n256
#pragma GCC pop_options
#endif

namespace {

// A row function for the level in force: name's AVX-512 or AVX2 body, or name##_scalar.
#ifdef SLM_CPU_VEC_X86
template <class F>
F by_level(F v512, F v256, F scalar) {
  if (cpu_isa() >= CpuIsa::Avx512) return v512;
  if (cpu_isa() == CpuIsa::Avx2) return v256;
  return scalar;
}
#define SLM_ROW_FN(name, T) by_level(&n512::name<T>, &n256::name<T>, &name##_scalar<T>)
#else
#define SLM_ROW_FN(name, T) (&name##_scalar<T>)
#endif

// Rows per task: a task does at least ~32k elements, so a decode step's handful of rows (a few
// microseconds of work) stays on the calling thread instead of waking the pool for it.
int64_t grain(int64_t row) { return std::max<int64_t>(1, 32768 / row); }

template <class T>
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& w, float eps) {
  const int64_t H = x.size(-1), rows = x.numel() / H;
  auto y = at::empty_like(x);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const auto row = SLM_ROW_FN(rms_norm_row, T);
  // Rows in tasks of at least grain(H) (each row's arithmetic unchanged).
  at::parallel_for(0, rows, grain(H), [&](int64_t r0, int64_t r1) {
    std::vector<float> h(H);
    for (int64_t r = r0; r < r1; ++r) row(xp + r * H, wp, yp + r * H, H, eps, h.data());
  });
  return y;
}

template <class T>
at::Tensor norm_rope_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin, float eps) {
  const int64_t B = x.size(0) * x.size(1), n = x.size(2), D = x.size(3);  // B: the (row, position) pairs
  auto y = at::empty_like(x);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.defined() ? w.data_ptr<T>() : nullptr;
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const auto row = SLM_ROW_FN(norm_rope_row, T);
  at::parallel_for(0, B * n, grain(D), [&](int64_t r0, int64_t r1) {
    std::vector<float> h(D);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / n;
      row(xp + r * D, wp, cp + b * D, sp + b * D, yp + r * D, D, eps, h.data());
    }
  });
  return y;
}

template <class T>
at::Tensor silu_mul_rows(const at::Tensor& g, const at::Tensor& u) {
  const int64_t n = g.size(-1), rows = g.numel() / n;
  auto y = at::empty_like(g);
  const T* gp = g.data_ptr<T>();
  const T* up = u.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const auto row = SLM_ROW_FN(silu_mul_row, T);
  at::parallel_for(0, rows, grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(gp + r * n, up + r * n, yp + r * n, n);
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

struct Counter {
  std::atomic<uint64_t> calls{0}, positions{0};
  at::Tensor add(at::Tensor y, int64_t positions_) {
    calls.fetch_add(1, std::memory_order_relaxed);
    positions.fetch_add(static_cast<uint64_t>(positions_), std::memory_order_relaxed);
    return y;
  }
  CpuNormCount get() const { return {calls.load(std::memory_order_relaxed), positions.load(std::memory_order_relaxed)}; }
};
Counter rms_count, rope_count, silu_count;

}  // namespace

CpuNormCounts cpu_norm_counts() { return {rms_count.get(), rope_count.get(), silu_count.get()}; }

at::Tensor cpu_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!usable(x) || x.dim() < 1 || !same(w, x) || w.dim() != 1 || w.size(0) != x.size(-1)) return {};
  const float e = static_cast<float>(eps);
  return rms_count.add(x.scalar_type() == at::kFloat ? rms_norm_rows<float>(x, w, e) : rms_norm_rows<c10::BFloat16>(x, w, e),
                       x.numel() / x.size(-1));
}

at::Tensor cpu_norm_rope(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin, double eps) {
  if (!usable(x) || x.dim() != 4 || x.size(3) % 2 != 0) return {};
  const int64_t B = x.size(0), T = x.size(1), D = x.size(3);
  if (w.defined() && (!same(w, x) || w.dim() != 1 || w.size(0) != D)) return {};
  for (const auto* t : {&cos, &sin})
    if (!same(*t, x) || t->numel() != B * T * D || t->size(0) != B || t->size(-1) != D) return {};
  const float e = static_cast<float>(eps);
  return rope_count.add(
      x.scalar_type() == at::kFloat ? norm_rope_rows<float>(x, w, cos, sin, e) : norm_rope_rows<c10::BFloat16>(x, w, cos, sin, e), B * T);
}

at::Tensor cpu_silu_mul(const at::Tensor& g, const at::Tensor& u) {
  if (!usable(g) || g.dim() < 1 || g.size(-1) < 1 || !same(u, g) || !u.sizes().equals(g.sizes())) return {};
  return silu_count.add(g.scalar_type() == at::kFloat ? silu_mul_rows<float>(g, u) : silu_mul_rows<c10::BFloat16>(g, u),
                        g.numel() / g.size(-1));
}

}  // namespace slm
