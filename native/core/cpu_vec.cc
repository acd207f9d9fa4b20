// Vectorised passes over a row of floats, shared by the fused sampler (sampler_cpu.cc) and the decode
// attention kernel (cpu_attention.cc).
#include "core/cpu_vec.h"

#include "core/cpu_isa.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace slm {

namespace {

// cpu_row_pick's walk from i, with acc the sum of p[0..i).
int64_t pick_scan(const float* p, int64_t i, int64_t n, double acc, float target) {
  for (; i < n; ++i) {
    acc += p[i];
    if (static_cast<float>(acc) >= target) return i;
  }
  return n - 1;
}

}  // namespace

#ifdef SLM_CPU_VEC_X86
namespace {

__attribute__((target("avx512f,avx512bw"))) float row_max_512(const float* s, int64_t V) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= V; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + i));
  float r = _mm512_reduce_max_ps(m);
  for (; i < V; ++i) r = std::max(r, s[i]);
  return r;
}

__attribute__((target("avx512f,avx512bw"))) double row_exp_512(const float* s, int64_t V, float shift, float* out) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= V; i += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + i), sh));
    if (out) _mm512_storeu_ps(out + i, e);
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  if (i < V) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (V - i)) - 1u);
    const __m512 e = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + i), sh)));
    if (out) _mm512_mask_storeu_ps(out + i, mk, e);
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

__attribute__((target("avx512f,avx512bw"))) int64_t row_pick_512(const float* p, int64_t n, float target) {
  double acc = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
    for (int j = 0; j < 64; j += 16) {
      const __m512 v = _mm512_loadu_ps(p + i + j);
      a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
      b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    const double c = _mm512_reduce_add_pd(_mm512_add_pd(a, b));
    if (static_cast<float>(acc + c) >= target) break;  // the chunk may hold it: scan it one by one
    acc += c;
  }
  return pick_scan(p, i, n, acc, target);
}

// The same passes with AVX2 (8 lanes).
#pragma GCC push_options
#pragma GCC target("avx2,fma")
using V8 = simd::V8;

float row_max_256(const float* s, int64_t V) {
  __m256 m = V8::set1(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) m = V8::max(m, V8::load(s + i));
  float r = V8::reduce_max(m);
  for (; i < V; ++i) r = std::max(r, s[i]);
  return r;
}

// Adds the 8 floats of e, widened, to two accumulators of 4 doubles.
inline void add_widened(__m256 e, __m256d& a0, __m256d& a1) {
  a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
  a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
}

inline double sum_pd(__m256d a) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

double row_exp_256(const float* s, int64_t V, float shift, float* out) {
  const __m256 sh = V8::set1(shift);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 e = V8::exp(V8::sub(V8::load(s + i), sh));
    if (out) V8::store(out + i, e);
    add_widened(e, a0, a1);
  }
  if (i < V) {
    const int n = static_cast<int>(V - i);
    const __m256 e = _mm256_and_ps(V8::exp(V8::sub(V8::load_n(s + i, n), sh)), _mm256_castsi256_ps(V8::first(n)));
    if (out) V8::store_n(out + i, e, n);
    add_widened(e, a0, a1);
  }
  return sum_pd(_mm256_add_pd(a0, a1));
}

int64_t row_pick_256(const float* p, int64_t n, float target) {
  double acc = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    for (int j = 0; j < 64; j += 8) add_widened(V8::load(p + i + j), a, b);
    const double c = sum_pd(_mm256_add_pd(a, b));
    if (static_cast<float>(acc + c) >= target) break;  // the chunk may hold it: scan it one by one
    acc += c;
  }
  return pick_scan(p, i, n, acc, target);
}
#pragma GCC pop_options

}  // namespace
#endif

int64_t cpu_row_pick(const float* p, int64_t n, float target) {
#ifdef SLM_CPU_VEC_X86
  if (cpu_isa() >= CpuIsa::Avx512) return row_pick_512(p, n, target);
  if (cpu_isa() == CpuIsa::Avx2) return row_pick_256(p, n, target);
#endif
  return pick_scan(p, 0, n, 0.0, target);
}

float cpu_row_max(const float* s, int64_t V) {
#ifdef SLM_CPU_VEC_X86
  if (cpu_isa() >= CpuIsa::Avx512) return row_max_512(s, V);
  if (cpu_isa() == CpuIsa::Avx2) return row_max_256(s, V);
#endif
  float r = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) r = std::max(r, s[i]);
  return r;
}

double cpu_row_exp(const float* s, int64_t V, float shift, float* out) {
#ifdef SLM_CPU_VEC_X86
  if (cpu_isa() >= CpuIsa::Avx512) return row_exp_512(s, V, shift, out);
  if (cpu_isa() == CpuIsa::Avx2) return row_exp_256(s, V, shift, out);
#endif
  double z = 0;
  for (int64_t i = 0; i < V; ++i) {
    const float e = std::exp(s[i] - shift);
    if (out) out[i] = e;
    z += e;
  }
  return z;
}

}  // namespace slm
