#include "core/cpu_gemm.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace slm {

namespace {

std::atomic<bool> g_enabled{true};

enum class Isa { None, Avx2, Avx512, Avx512Bf16 };

Isa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    return __builtin_cpu_supports("avx512bf16") ? Isa::Avx512Bf16 : Isa::Avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
  return Isa::None;
}

Isa isa() {
  static const Isa i = detect();
  return i;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SLM_X86 1
#define T512 __attribute__((target("avx512f,avx512bw")))
#define T512BF __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define T256 __attribute__((target("avx2,fma")))

// Sums each of 16 registers into one lane of the result (lane i = the sum of v[i]) with a transpose
// tree: 45 shuffles and adds instead of ~150 for 16 separate horizontal sums. Every register's lanes
// are added in the same order whatever the others hold, so a tile with fewer rows or columns (zeros
// in the unused registers) gives each output exactly the value a full tile gives it.
T512 inline __m512 reduce16(const __m512 v[16]) {
  __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

// The MR x NR sums of a tile's accumulators, row-major in 16 floats.
template <int MR, int NR>
T512 inline void tile_sums(const __m512 (&acc)[MR][NR], float out[16]) {
  __m512 v[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) v[i] = (i / 4 < MR && i % 4 < NR) ? acc[i / 4 < MR ? i / 4 : 0][i % 4 < NR ? i % 4 : 0] : _mm512_setzero_ps();
  _mm512_storeu_ps(out, reduce16(v));
}

// ---- float32, AVX-512: 16 lanes; tiles of MR input rows x NR weight rows, 16 accumulators at most.
template <int MR, int NR>
T512 inline void tile_f32_512(const float* x, const float* w, int64_t K, float* y, int64_t ldy, const float* pf, int pf_rows) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = _mm512_loadu_ps(w + n * K + k);
    for (int r = 0; r < pf_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * K + k), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  if (k < K) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = _mm512_maskz_loadu_ps(mk, w + n * K + k);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  float sums[16];
  tile_sums<MR, NR>(acc, sums);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) y[m * ldy + n] = sums[m * 4 + n];
}

// ---- bfloat16, AVX512_BF16: 32 values per register, pairs multiplied and summed into 16 float32
// lanes (vdpbf16ps); the sums are rounded to bfloat16 once, at the end, as oneDNN's bf16 gemm does.
// TY (deduced from y) uint16_t: bfloat16 out; float: the same bfloat16-rounded value widened
// (exactly) to float32, for the vocabulary head, whose logits the sampler reads in float32.
template <int MR, int NR, typename TY>
T512BF inline void tile_bf16_512(const uint16_t* x, const uint16_t* w, int64_t K, TY* y, int64_t ldy, const uint16_t* pf, int pf_rows) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = (__m512bh)_mm512_loadu_si512(w + n * K + k);
    for (int r = 0; r < pf_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * K + k), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, wv[n]);
    }
  }
  if (k < K) {
    const __mmask32 mk = static_cast<__mmask32>((K - k) >= 32 ? ~0u : ((1u << (K - k)) - 1u));
    __m512bh wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + n * K + k);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, wv[n]);
    }
  }
  float sums[16];
  tile_sums<MR, NR>(acc, sums);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      const c10::BFloat16 b(sums[m * 4 + n]);  // round to nearest even
      if constexpr (std::is_same_v<TY, float>)
        y[m * ldy + n] = static_cast<float>(b);
      else
        std::memcpy(&y[m * ldy + n], &b, sizeof(uint16_t));
    }
}

// ---- float32, AVX2 + FMA: 8 lanes; tiles of up to 4 input rows x 2 weight rows (8 accumulators).
T256 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int MR, int NR>
T256 inline void tile_f32_256(const float* x, const float* w, int64_t K, float* y, int64_t ldy, const float* pf, int pf_rows) {
  (void)pf, (void)pf_rows;
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = _mm256_loadu_ps(w + n * K + k);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  float tail[MR][NR] = {};
  for (; k < K; ++k)
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n) tail[m][n] += x[m * K + k] * w[n * K + k];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) y[m * ldy + n] = hsum256(acc[m][n]) + tail[m][n];
}

// One thread's share: weight rows [n0, n1) against every input row. Each weight tile is multiplied
// with all input rows before the next is loaded, so weights come from memory once. Meanwhile the
// tile four ahead is prefetched into L2, one cache line per step, spread over the passes of the input
// rows (a burst would overflow the core's outstanding-miss slots; with the hardware prefetcher alone
// the vocabulary projection waited on memory at half the arithmetic rate: 28 ms -> 23 ms here).
#define SLM_DEFINE_RANGE(NAME, TARGET, TILE, TX, TY, NRMAX)                                                     \
  TARGET void NAME(const TX* x, int64_t M, const TX* w, int64_t K, TY* y, int64_t N, int64_t n0, int64_t n1) { \
    const int64_t passes = (M + 3) / 4;                                                                        \
    const int per_pass = static_cast<int>((NRMAX + passes - 1) / passes);                                      \
    for (int64_t n = n0; n < n1; n += NRMAX) {                                                                 \
      const int64_t nr = std::min<int64_t>(NRMAX, n1 - n);                                                     \
      const bool prefetch = n + 5 * NRMAX <= n1;                                                               \
      for (int64_t m = 0; m < M; m += 4) {                                                                     \
        const int64_t mr = std::min<int64_t>(4, M - m);                                                        \
        const TX* xm = x + m * K;                                                                              \
        const TX* wn = w + n * K;                                                                              \
        TY* ym = y + m * N + n;                                                                                \
        const int64_t first = (m / 4) * per_pass;                                                              \
        const int pf_rows = prefetch ? static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(per_pass, NRMAX - first))) : 0; \
        const TX* pf = w + (n + 4 * NRMAX + (pf_rows ? first : 0)) * K;                                            \
        switch (mr * 8 + nr) {                                                                                 \
          case 4 * 8 + NRMAX: TILE<4, NRMAX>(xm, wn, K, ym, N, pf, pf_rows); break;                            \
          case 3 * 8 + NRMAX: TILE<3, NRMAX>(xm, wn, K, ym, N, pf, pf_rows); break;                            \
          case 2 * 8 + NRMAX: TILE<2, NRMAX>(xm, wn, K, ym, N, pf, pf_rows); break;                            \
          case 1 * 8 + NRMAX: TILE<1, NRMAX>(xm, wn, K, ym, N, pf, pf_rows); break;                            \
          default:                                                                                             \
            for (int64_t i = 0; i < nr; ++i) switch (mr) {                                                     \
                case 4: TILE<4, 1>(xm, wn + i * K, K, ym + i, N, nullptr, 0); break;                           \
                case 3: TILE<3, 1>(xm, wn + i * K, K, ym + i, N, nullptr, 0); break;                           \
                case 2: TILE<2, 1>(xm, wn + i * K, K, ym + i, N, nullptr, 0); break;                           \
                default: TILE<1, 1>(xm, wn + i * K, K, ym + i, N, nullptr, 0); break;                          \
              }                                                                                                \
        }                                                                                                      \
      }                                                                                                        \
    }                                                                                                          \
  }

SLM_DEFINE_RANGE(range_f32_512, T512, tile_f32_512, float, float, 4)
SLM_DEFINE_RANGE(range_bf16_512, T512BF, tile_bf16_512, uint16_t, uint16_t, 4)
SLM_DEFINE_RANGE(range_bf16f_512, T512BF, tile_bf16_512, uint16_t, float, 4)
SLM_DEFINE_RANGE(range_f32_256, T256, tile_f32_256, float, float, 2)
#undef SLM_DEFINE_RANGE
#endif  // x86

}  // namespace

bool cpu_has_avx512() { return isa() == Isa::Avx512 || isa() == Isa::Avx512Bf16; }

const char* cpu_small_linear_isa() {
  switch (isa()) {
    case Isa::Avx512Bf16: return "avx512 (float32, bfloat16)";
    case Isa::Avx512: return "avx512 (float32)";
    case Isa::Avx2: return "avx2 (float32)";
    default: return "none";
  }
}

void set_cpu_kernels_enabled(bool on) { g_enabled.store(on); }
bool cpu_kernels_enabled() { return g_enabled.load(); }

at::Tensor cpu_small_linear(const at::Tensor& x, const at::Tensor& w, bool float_out, const at::Tensor& out) {
#ifdef SLM_X86
  if (!g_enabled.load(std::memory_order_relaxed)) return {};
  const Isa i = isa();
  if (i == Isa::None || !x.is_cpu() || !w.is_cpu() || x.scalar_type() != w.scalar_type() || w.dim() != 2) return {};
  const auto dt = x.scalar_type();
  if (!(dt == at::kFloat || (dt == at::kBFloat16 && i == Isa::Avx512Bf16))) return {};
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) return {};
  const int64_t K = w.size(1), N = w.size(0);
  if (x.dim() < 1 || x.size(-1) != K || K == 0 || N == 0) return {};
  const int64_t M = x.numel() / K;
  if (M < 1 || M > kSmallLinearMaxRows) return {};
  const auto wc = w.is_contiguous() ? w : w.contiguous();
  const auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  const auto ydt = float_out ? at::kFloat : dt;
  at::Tensor y;
  if (out.defined() && out.is_cpu() && out.scalar_type() == ydt && out.is_contiguous() && out.numel() >= M * N)
    y = out.view({-1}).narrow(0, 0, M * N).view(sizes);  // the caller's buffer: its pages stay mapped
  else
    y = at::empty(sizes, x.options().dtype(ydt));
  // Tiles of weight rows per task: enough work per task (~64k multiply-adds) that a small product
  // stays on one thread instead of paying for a parallel region.
  const int64_t nr = i == Isa::Avx2 ? 2 : 4;
  const int64_t tiles = (N + nr - 1) / nr;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, nr * M * K));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * nr, n1 = std::min(N, t1 * nr);
    if (dt == at::kBFloat16) {
      const auto* xb = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
      const auto* wb = reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>());
      if (float_out)
        range_bf16f_512(xb, M, wb, K, y.data_ptr<float>(), N, n0, n1);
      else
        range_bf16_512(xb, M, wb, K, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, n0, n1);
    } else if (i == Isa::Avx2) {
      range_f32_256(xc.data_ptr<float>(), M, wc.data_ptr<float>(), K, y.data_ptr<float>(), N, n0, n1);
    } else {
      range_f32_512(xc.data_ptr<float>(), M, wc.data_ptr<float>(), K, y.data_ptr<float>(), N, n0, n1);
    }
  });
  return y;
#else
  (void)x;
  (void)w;
  (void)float_out;
  (void)out;
  return {};
#endif
}

}  // namespace slm
