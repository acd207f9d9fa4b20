// Vectorised passes over a row of floats on the CPU: its maximum, and exp(s - shift) with its sum.
// AVX-512 or AVX2 as cpu_isa() allows (exp from a degree-6 polynomial on [-ln2/2, ln2/2] and a
// scale by 2^n, within 2 ulp of expf: core/simd.h), scalar otherwise.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SLM_CPU_VEC_X86 1
#include "core/simd.h"
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
__attribute__((target("avx512f,avx512bw"))) inline __m512 exp512(__m512 x) { return simd::V16::exp(x); }
#endif

}  // namespace slm
