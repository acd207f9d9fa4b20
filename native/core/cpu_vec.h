// Vectorised passes over a row of floats on the CPU: its maximum, and exp(s - shift) with its sum.
// AVX-512 where the CPU has it (exp from a degree-6 polynomial on [-ln2/2, ln2/2] and a scale by
// 2^n, within 2 ulp of expf), scalar otherwise.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SLM_CPU_VEC_X86 1
#include <immintrin.h>
#endif

namespace slm {

// max(s[0..n)); -inf for an empty row.
float cpu_row_max(const float* s, int64_t n);
// out[i] = exp(s[i] - shift) (when out is not null, which may be s itself); returns the sum,
// accumulated in double.
double cpu_row_exp(const float* s, int64_t n, float shift, float* out);
// The first i whose running sum p[0] + ... + p[i], accumulated in double and rounded to float,
// reaches target (n - 1 if none does): inverse-CDF sampling over non-negative p. Whole 64-element
// chunks that cannot hold it are skipped with one vector sum each instead of 64 dependent adds.
int64_t cpu_row_pick(const float* p, int64_t n, float target);

#ifdef SLM_CPU_VEC_X86
// exp of 16 floats (inputs clamped to [-103, 88.7]); for AVX-512 code only.
__attribute__((target("avx512f"))) inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}
#endif

}  // namespace slm
