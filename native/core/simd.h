// The vector operations the CPU kernels are written with, one struct per instruction set: V16
// (AVX-512 F/BW, 16 float lanes) and V8 (AVX2 + FMA, 8 lanes). A kernel is written once against
// `V` and compiled for each level inside that level's target region:
//
//   #pragma GCC push_options
//   #pragma GCC target("avx512f,avx512bw")
//   namespace k512 { using V = simd::V16; #include "core/x_impl.h" }
//   #pragma GCC pop_options
//
// and the caller picks the namespace from cpu_isa() (core/cpu_isa.h). Arithmetic is the same at
// every level where the lane count does not enter it (each lane's fused multiply-adds, the same exp
// polynomial and exact scaling); horizontal sums and maxima differ in order between levels.
#pragma once
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SLM_SIMD_X86 1
#include <immintrin.h>

#include <cstdint>
#include <limits>

namespace slm::simd {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
struct V16 {
  using F = __m512;
  static constexpr int W = 16;
  static inline F zero() { return _mm512_setzero_ps(); }
  static inline F set1(float x) { return _mm512_set1_ps(x); }
  static inline F load(const float* p) { return _mm512_loadu_ps(p); }
  // bfloat16 (raw bits) -> float32: the 16 bits on top.
  static inline F load(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  // The first n (< W) lanes, zeros after; memory past them is not read.
  static inline F load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p); }
  static inline F load_n(const uint16_t* p, int n) {
    const __m512i h = _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1u << n) - 1u), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
  }
  static inline void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static inline void store_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), v); }
  // x rounded to bfloat16 (to nearest, ties to even; NaN to the quiet NaN 0x7FC0), as float32: what
  // c10::BFloat16(x) holds. Then stored as bfloat16 (raw bits): the 16 bits on top of a rounded value.
  static inline F round_bf16(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), _mm512_set1_epi32(~0xFFFF));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(r);
  }
  static inline void store(uint16_t* p, F rounded) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16)));
  }
  static inline F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static inline F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static inline F add(F a, F b) { return _mm512_add_ps(a, b); }
  static inline F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static inline F div(F a, F b) { return _mm512_div_ps(a, b); }
  static inline F max(F a, F b) { return _mm512_max_ps(a, b); }
  static inline float reduce_add(F v) { return _mm512_reduce_add_ps(v); }
  static inline float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  // m == lowest float ? lowest : v (a masked score stays masked).
  static inline F keep_lowest(F m, F v) {
    const F lo = set1(std::numeric_limits<float>::lowest());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, lo, _CMP_EQ_OQ), v, lo);
  }
  // x == lowest float ? 0 : p (a masked key's probability).
  static inline F zero_lowest(F x, F p) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(std::numeric_limits<float>::lowest()), _CMP_NEQ_OQ), p);
  }
  // p * 2^n for integral n in [-149, 128], rounded once.
  static inline F scale2(F p, F n) { return _mm512_scalef_ps(p, n); }
  static inline F round(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline F min(F a, F b) { return _mm512_min_ps(a, b); }
  // exp (inputs clamped to [-103, 88.7]): a degree-6 polynomial on [-ln2/2, ln2/2] and a scale by
  // 2^n, within 2 ulp of expf.
#include "core/simd_exp.inc"
};
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
struct V8 {
  using F = __m256;
  static constexpr int W = 8;
  static inline F zero() { return _mm256_setzero_ps(); }
  static inline F set1(float x) { return _mm256_set1_ps(x); }
  static inline F load(const float* p) { return _mm256_loadu_ps(p); }
  static inline F load(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static inline __m256i first(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static inline F load_n(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static inline F load_n(const uint16_t* p, int n) {
    alignas(32) uint16_t b[8] = {};
    for (int i = 0; i < n; ++i) b[i] = p[i];
    return load(b);
  }
  static inline void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static inline void store_n(float* p, F v, int n) { _mm256_maskstore_ps(p, first(n), v); }
  static inline F round_bf16(F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), _mm256_set1_epi32(~0xFFFF));
    const F nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
  }
  static inline void store(uint16_t* p, F rounded) {
    const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(rounded), 16);  // each lane <= 0xFFFF: packus keeps it
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
  static inline F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static inline F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static inline F add(F a, F b) { return _mm256_add_ps(a, b); }
  static inline F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static inline F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static inline F div(F a, F b) { return _mm256_div_ps(a, b); }
  static inline F max(F a, F b) { return _mm256_max_ps(a, b); }
  static inline F min(F a, F b) { return _mm256_min_ps(a, b); }
  static inline float reduce_add(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline float reduce_max(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline F keep_lowest(F m, F v) {
    const F lo = set1(std::numeric_limits<float>::lowest());
    return _mm256_blendv_ps(v, lo, _mm256_cmp_ps(m, lo, _CMP_EQ_OQ));
  }
  static inline F zero_lowest(F x, F p) {
    return _mm256_and_ps(p, _mm256_cmp_ps(x, set1(std::numeric_limits<float>::lowest()), _CMP_NEQ_OQ));
  }
  // p * 2^n without AVX-512's scalef: two exact power-of-two factors, each a normal float for n in
  // [-149, 128]; only the second product can round (to a denormal), as scalef rounds it.
  static inline F scale2(F p, F n) {
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const F f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const F f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
  }
  static inline F round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#include "core/simd_exp.inc"
};
#pragma GCC pop_options

}  // namespace slm::simd
#endif
