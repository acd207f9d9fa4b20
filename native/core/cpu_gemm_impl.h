// The CPU small-row linear kernels of cpu_gemm.cc, x86 only: AVX-512 (float32 or widened bfloat16
// weights; bfloat16 dot products) and AVX2 + FMA tiles for 3+ input rows, the row kernels for one or
// two, and the ranges that walk one thread's share of weight rows with them. Included once, inside
// cpu_gemm.cc's anonymous namespace and its x86 region (which defines T512, T512BF, T256 and
// kRowsMaxInputs); cpu_small_linear there picks the kernel and shares the rows between threads.

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
  for (int i = 0; i < 16; ++i)
    v[i] = (i / 4 < MR && i % 4 < NR) ? acc[i / 4 < MR ? i / 4 : 0][i % 4 < NR ? i % 4 : 0] : _mm512_setzero_ps();
  _mm512_storeu_ps(out, reduce16(v));
}

// A tile's float32 sum as y's type. Weights in bfloat16 (TW uint16_t): the sum rounded to bfloat16
// (nearest even) once, stored as bfloat16 bits or widened (exactly) to float32 for the vocabulary
// head; float32 weights: the sum as it is.
template <typename TW>
inline void put(float* y, float v) {
  *y = std::is_same_v<TW, uint16_t> ? static_cast<float>(c10::BFloat16(v)) : v;
}
template <typename TW>
inline void put(uint16_t* y, float v) {
  const c10::BFloat16 b(v);
  std::memcpy(y, &b, sizeof(uint16_t));
}
inline float widen(float w) { return w; }
inline float widen(uint16_t w) { return static_cast<float>(c10::BFloat16(w, c10::BFloat16::from_bits())); }

// ---- float32 arithmetic, AVX-512: 16 lanes; tiles of MR input rows x NR weight rows, 16
// accumulators at most. Weights TW: float32, or bfloat16 (raw bits) widened in registers, for CPUs
// without bfloat16 dot products (the sums rounded to bfloat16 once when y is bfloat16).
template <int MR, int NR, typename TW, typename TY>
T512 inline void tile_512(const float* x, const TW* w, int64_t K, TY* y, int64_t ldy, const TW* pf, int pf_rows) {
  using V = simd::V16;
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = V::load(w + n * K + k);
    for (int r = 0; r < pf_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * K + k), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = V::load_n(w + n * K + k, rest);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = V::load_n(x + m * K + k, rest);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  float sums[16];
  tile_sums<MR, NR>(acc, sums);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) put<TW>(&y[m * ldy + n], sums[m * 4 + n]);
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
    for (int n = 0; n < NR; ++n) put<uint16_t>(&y[m * ldy + n], sums[m * 4 + n]);  // rounded to nearest even
}

// ---- AVX-512, one or two input rows (a decode at batch 1 or 2): whole weight rows read one after
// another, each with the arithmetic of tile_512 / tile_bf16_512 (one accumulator over k in the same steps), the sums
// of 16 rows reduced at once by reduce16, which gives each lane the value tile_sums gives it: a row's
// result does not depend on how many input rows came with it. Memory-bound: four weight rows read in
// lock-step (the tiles) kept the reads below the machine's bandwidth on the vocabulary head; whole rows
// one after another reach it (a 2-core Zen 4, the head's shape alone, 2 threads: 0.83-0.88 of the
// lock-step tile's time, level with a loop that only reads the weights).

// One weight row's accumulator, float32 arithmetic (weights float32 or widened bfloat16), as tile_512.
template <typename TW>
T512 inline __m512 row_acc_512(const float* x, const TW* wr, int64_t K) {
  using V = simd::V16;
  __m512 a = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), V::load(wr + k), a);
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    a = _mm512_fmadd_ps(V::load_n(x + k, rest), V::load_n(wr + k, rest), a);
  }
  return a;
}

// One weight row's accumulator with bfloat16 dot products, as tile_bf16_512.
T512BF inline __m512 row_acc_bf16_512(const uint16_t* x, const uint16_t* wr, int64_t K) {
  __m512 a = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(x + k), (__m512bh)_mm512_loadu_si512(wr + k));
  if (k < K) {
    const __mmask32 mk = static_cast<__mmask32>((1u << (K - k)) - 1u);
    a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_maskz_loadu_epi16(mk, x + k), (__m512bh)_mm512_maskz_loadu_epi16(mk, wr + k));
  }
  return a;
}

// Weight rows [n0, n1) against M (at most kRowsMaxInputs) input rows: ROW_ACC per weight row and input
// row (the weight row read from memory for the first, from L1 for the others), reduce16 per 16 rows,
// each sum stored by put<TW> at y[m * ldy + n] (bfloat16 weights: rounded to bfloat16 once). A macro,
// as the ranges below, because each needs its own target.
#define SLM_DEFINE_ROWS(NAME, TARGET, TX, ROW_ACC)                                                                         \
  template <typename TW, typename TY>                                                                                      \
  TARGET void NAME(const TX* x, int64_t M, const TW* w, int64_t K, TY* y, int64_t ldy, int64_t n0, int64_t n1) {           \
    __m512 acc[kRowsMaxInputs][16];                                                                                        \
    for (int64_t n = n0; n < n1; n += 16) {                                                                                \
      const int rw = static_cast<int>(std::min<int64_t>(16, n1 - n));                                                      \
      for (int j = 0; j < 16; ++j)                                                                                         \
        for (int64_t m = 0; m < M; ++m) acc[m][j] = j < rw ? ROW_ACC(x + m * K, w + (n + j) * K, K) : _mm512_setzero_ps(); \
      for (int64_t m = 0; m < M; ++m) {                                                                                    \
        float sums[16];                                                                                                    \
        _mm512_storeu_ps(sums, reduce16(acc[m]));                                                                          \
        for (int j = 0; j < rw; ++j) put<TW>(&y[m * ldy + n + j], sums[j]);                                                \
      }                                                                                                                    \
    }                                                                                                                      \
  }
SLM_DEFINE_ROWS(rows_512, T512, float, row_acc_512)
SLM_DEFINE_ROWS(rows_bf16_512, T512BF, uint16_t, row_acc_bf16_512)
#undef SLM_DEFINE_ROWS

// ---- float32 arithmetic, AVX2 + FMA: 8 lanes; tiles of up to 4 input rows x 3 weight rows (12
// accumulators of the 16 registers), or x 4 weight rows for two input rows (enough independent sums
// to cover the multiply-add latency; one input row: rows_256 below); weights float32 or bfloat16 as
// tile_512, the tile four ahead prefetched as there. The tile's weight rows (and the prefetched
// rows) lie ldw values apart, its outputs ys apart in y (range_256 takes rows far apart).
template <int MR, int NR, typename TW, typename TY, bool PK>
T256 inline __attribute__((always_inline)) void tile_256(const float* x, const TW* w, int64_t K, TY* y, int64_t ldy, const TW* pf,
                                                         int pf_rows, int64_t ldw, int64_t ys, const float* xp) {
  using V = simd::V8;
  constexpr int64_t kLine = 64 / sizeof(TW);  // values of w per cache line
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  // One step: eight values of k for every input row and weight row.
  auto step = [&](int64_t k) __attribute__((always_inline, target("avx2,fma"))) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = V::load(w + n * ldw + k);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_loadu_ps(PK ? xp + k * 4 + m * 8 : x + m * K + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  };
  // A cache line of each weight row per iteration (two steps in float32, four in bfloat16) and its
  // prefetches, no test of k per step: the same sums in the same order as one step per iteration with
  // the prefetch under `k % kLine == 0`, which it replaced (a 2-core Zen 3, a decode step alternated
  // with the old loop in one process, paired medians: bfloat16 batch 16 1.065x and 1.086x over 16
  // rounds; float32 batch 16 1.03x and 1.02x, batch 48 0.98x: no change). always_inline: without it
  // GCC put the tiles out of line here (float32 batch 16 / 48 then 1.03x / 1.06x slower).
  int64_t k = 0;
  for (; k + kLine <= K; k += kLine) {
    for (int r = 0; r < pf_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * ldw + k), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int64_t s = 0; s < kLine; s += 8) step(k + s);
  }
  if (k + 8 <= K)
    for (int r = 0; r < pf_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * ldw + k), _MM_HINT_T1);
  for (; k + 8 <= K; k += 8) step(k);
  float tail[MR][NR] = {};
  for (; k < K; ++k)
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n) tail[m][n] += x[m * K + k] * widen(w[n * ldw + k]);
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) put<TW>(&y[m * ldy + n * ys], V::reduce_add(acc[m][n]) + tail[m][n]);
}

// ---- AVX2 + FMA, one or two input rows (a decode at batch 1 or 2): whole weight rows, each multiplied
// with each input row with the arithmetic of tile_256 (one sum over k in steps of 8), so a row's result
// does not depend on how many rows came with it. Memory-bound, and one sum is a chain of multiply-adds
// 4 cycles apart that stalls behind each load that waits: S rows far apart in the thread's share (in
// blocks of up to kStreamBlock rows, row i of each stream of a block in step) give S independent sums
// and S sequential streams for the prefetchers. Rows next to each other in step read slower instead (the
// streams share pages). Measured on a 2-core Zen 3 outside the project, the vocabulary head's 151,936 x
// 512, 2 threads, alternated, medians of 21: 4 streams in blocks of 128 rows 1.31x (bfloat16) and 1.18x
// (float32) the rows one after another; 2 rows next to each other 0.57x / 0.77x.
template <int S, int MI, typename TW, typename TY>
T256 inline __attribute__((always_inline)) void rows_group_256(const float* x, const TW* w, int64_t K, TY* y, int64_t ldy, int64_t n,
                                                               int64_t stride) {
  using V = simd::V8;
  __m256 acc[S][MI];
  const TW* wr[S];
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    wr[j] = w + (n + j * stride) * K;
#pragma GCC unroll 2
    for (int m = 0; m < MI; ++m) acc[j][m] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 xv[MI];
#pragma GCC unroll 2
    for (int m = 0; m < MI; ++m) xv[m] = _mm256_loadu_ps(x + m * K + k);
#pragma GCC unroll 4
    for (int j = 0; j < S; ++j) {
      const __m256 wv = V::load(wr[j] + k);
#pragma GCC unroll 2
      for (int m = 0; m < MI; ++m) acc[j][m] = _mm256_fmadd_ps(xv[m], wv, acc[j][m]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j)
#pragma GCC unroll 2
    for (int m = 0; m < MI; ++m) {
      float tail = 0;
      for (int64_t t = k; t < K; ++t) tail += x[m * K + t] * widen(wr[j][t]);
      put<TW>(&y[m * ldy + n + j * stride], V::reduce_add(acc[j][m]) + tail);
    }
}

constexpr int64_t kStreamBlock = 256;  // rows per block of streams (rows_256, range_256)
constexpr int64_t kAhead = 4;          // range_256: the tile this many on is prefetched
constexpr int64_t kFarMaxInputs = 8;   // range_256: far rows up to this many input rows

template <int S, int MI, typename TW, typename TY>
T256 void rows_mi_256(const float* x, const TW* w, int64_t K, TY* y, int64_t ldy, int64_t n0, int64_t n1) {
  int64_t n = n0;
  while (n1 - n >= S) {
    const int64_t len = std::min<int64_t>(kStreamBlock, n1 - n) / S;  // rows per stream in this block
    for (int64_t i = 0; i < len; ++i) rows_group_256<S, MI>(x, w, K, y, ldy, n + i, len);
    n += len * S;
  }
  for (; n < n1; ++n) rows_group_256<1, MI>(x, w, K, y, ldy, n, 0);
}

template <int S, typename TW, typename TY>
T256 void rows_256(const float* x, int64_t M, const TW* w, int64_t K, TY* y, int64_t ldy, int64_t n0, int64_t n1) {
  static_assert(kRowsMaxInputs == 2, "rows_256 handles one or two input rows");
  if (M == 1)
    rows_mi_256<S, 1>(x, w, K, y, ldy, n0, n1);
  else
    rows_mi_256<S, 2>(x, w, K, y, ldy, n0, n1);
}

// One thread's share: weight rows [n0, n1) against every input row. Each weight tile is multiplied
// with all input rows before the next is loaded, so weights come from memory once. Meanwhile the
// tile four ahead is prefetched into L2, one cache line per step, spread over the passes of the input
// rows (a burst would overflow the core's outstanding-miss slots; with the hardware prefetcher alone
// the vocabulary projection waited on memory at half the arithmetic rate: 28 ms -> 23 ms here).
#define SLM_DEFINE_RANGE(NAME, TARGET, TILE, TX, TW, TY, NRMAX)                                                                \
  TARGET void NAME(const TX* x, int64_t M, const TW* w, int64_t K, TY* y, int64_t N, int64_t n0, int64_t n1) {                 \
    const int64_t passes = (M + 3) / 4;                                                                                        \
    const int per_pass = static_cast<int>((NRMAX + passes - 1) / passes);                                                      \
    for (int64_t n = n0; n < n1; n += NRMAX) {                                                                                 \
      const int64_t nr = std::min<int64_t>(NRMAX, n1 - n);                                                                     \
      const bool prefetch = n + 5 * NRMAX <= n1;                                                                               \
      for (int64_t m = 0; m < M; m += 4) {                                                                                     \
        const int64_t mr = std::min<int64_t>(4, M - m);                                                                        \
        const TX* xm = x + m * K;                                                                                              \
        const TW* wn = w + n * K;                                                                                              \
        TY* ym = y + m * N + n;                                                                                                \
        const int64_t first = (m / 4) * per_pass;                                                                              \
        const int pf_rows = prefetch ? static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(per_pass, NRMAX - first))) : 0; \
        const TW* pf = w + (n + 4 * NRMAX + (pf_rows ? first : 0)) * K;                                                        \
        switch (mr * 8 + nr) {                                                                                                 \
          case 4 * 8 + NRMAX:                                                                                                  \
            TILE<4, NRMAX>(xm, wn, K, ym, N, pf, pf_rows);                                                                     \
            break;                                                                                                             \
          case 3 * 8 + NRMAX:                                                                                                  \
            TILE<3, NRMAX>(xm, wn, K, ym, N, pf, pf_rows);                                                                     \
            break;                                                                                                             \
          case 2 * 8 + NRMAX:                                                                                                  \
            TILE<2, NRMAX>(xm, wn, K, ym, N, pf, pf_rows);                                                                     \
            break;                                                                                                             \
          case 1 * 8 + NRMAX:                                                                                                  \
            TILE<1, NRMAX>(xm, wn, K, ym, N, pf, pf_rows);                                                                     \
            break;                                                                                                             \
          default:                                                                                                             \
            for (int64_t i = 0; i < nr; ++i) switch (mr) {                                                                     \
                case 4:                                                                                                        \
                  TILE<4, 1>(xm, wn + i * K, K, ym + i, N, static_cast<const TW*>(nullptr), 0);                                \
                  break;                                                                                                       \
                case 3:                                                                                                        \
                  TILE<3, 1>(xm, wn + i * K, K, ym + i, N, static_cast<const TW*>(nullptr), 0);                                \
                  break;                                                                                                       \
                case 2:                                                                                                        \
                  TILE<2, 1>(xm, wn + i * K, K, ym + i, N, static_cast<const TW*>(nullptr), 0);                                \
                  break;                                                                                                       \
                default:                                                                                                       \
                  TILE<1, 1>(xm, wn + i * K, K, ym + i, N, static_cast<const TW*>(nullptr), 0);                                \
                  break;                                                                                                       \
              }                                                                                                                \
        }                                                                                                                      \
      }                                                                                                                        \
    }                                                                                                                          \
  }

SLM_DEFINE_RANGE(range_f32_512, T512, tile_512, float, float, float, 4)
SLM_DEFINE_RANGE(range_bf16_512, T512BF, tile_bf16_512, uint16_t, uint16_t, uint16_t, 4)
SLM_DEFINE_RANGE(range_bf16f_512, T512BF, tile_bf16_512, uint16_t, uint16_t, float, 4)
SLM_DEFINE_RANGE(range_wbf16_512, T512, tile_512, float, uint16_t, uint16_t, 4)
SLM_DEFINE_RANGE(range_wbf16f_512, T512, tile_512, float, uint16_t, float, 4)
#undef SLM_DEFINE_RANGE

// The AVX2 ranges: as above for more than kFarMaxInputs input rows. For 3 to kFarMaxInputs the step
// waits on memory, and a tile's NR weight rows are taken far apart instead (as rows_256's streams:
// blocks of up to kStreamBlock rows, `len` rows between a tile's rows), the tile kAhead on in the block
// prefetched; the sums and their order are the same either way. A 2-core Zen 3, decode steps in
// alternated processes against adjacent rows: 4 rows 1.05-1.34x (float32) and 1.30-1.41x (bfloat16), 8
// rows 1.01-1.07x / 1.00-1.15x; at 16 rows float32 0.90-1.12x, bfloat16 0.84-1.07x, at 24 0.87-1.05x: far
// rows only up to 8.
// tile_256 with its MR input rows (1 to 4) chosen at run time.
template <int NR, bool PK, typename TW, typename TY>
T256 inline __attribute__((always_inline)) void tile_rows_256(int64_t mr, const float* x, const TW* w, int64_t K, TY* y, int64_t ldy,
                                                              const TW* pf, int pf_rows, int64_t ldw, int64_t ys, const float* xp) {
  switch (mr) {
    case 4:
      tile_256<4, NR, TW, TY, PK>(x, w, K, y, ldy, pf, pf_rows, ldw, ys, xp);
      break;
    case 3:
      tile_256<3, NR, TW, TY, PK>(x, w, K, y, ldy, pf, pf_rows, ldw, ys, xp);
      break;
    case 2:
      tile_256<2, NR, TW, TY, PK>(x, w, K, y, ldy, pf, pf_rows, ldw, ys, xp);
      break;
    default:
      tile_256<1, NR, TW, TY, PK>(x, w, K, y, ldy, pf, pf_rows, ldw, ys, xp);
      break;
  }
}

// x in groups of 4 rows, each group's 8-value steps of its 4 rows one after another (the K - K % 8
// values of a step's 4 rows in one 128-byte run; a last group of fewer rows leaves the places of the
// rows it lacks unwritten: its tiles never read them): a tile's input rows then come from one stream
// instead of four rows 4 K bytes apart. Floats of xp: pack_size_256(M, K).
inline int64_t pack_size_256(int64_t M, int64_t K) { return (M + 3) / 4 * 4 * (K / 8 * 8); }
inline void pack_rows_256(const float* x, int64_t M, int64_t K, float* xp) {
  const int64_t K8 = K / 8 * 8;
  for (int64_t m0 = 0; m0 < M; m0 += 4)
    for (int64_t k = 0; k < K8; k += 8)
      for (int64_t r = 0; r < std::min<int64_t>(4, M - m0); ++r)
        std::memcpy(xp + m0 * K8 + k * 4 + r * 8, x + (m0 + r) * K + k, 8 * sizeof(float));
}

// Above kFarMaxInputs input rows the tiles read their input rows from xp (x packed by pack_rows_256,
// required there; unused below), the K % 8 values after the steps from x: the same products summed in
// the same order as from x.
template <int NRMAX, typename TW, typename TY>
T256 void range_256(const float* x, int64_t M, const TW* w, int64_t K, TY* y, int64_t N, int64_t n0, int64_t n1, const float* xp) {
  const int64_t passes = (M + 3) / 4, K8 = K / 8 * 8;
  const int per_pass = static_cast<int>((NRMAX + passes - 1) / passes);
  auto tiles = [&](auto packed, int64_t n, int64_t nr, int64_t stride, const TW* pfbase, bool prefetch)
      __attribute__((always_inline, target("avx2,fma"))) {
    constexpr bool PK = decltype(packed)::value;
    const int64_t ldw = stride * K;
    for (int64_t m = 0; m < M; m += 4) {
      const int64_t mr = std::min<int64_t>(4, M - m);
      const float* xm = x + m * K;
      const float* xpm = PK ? xp + m * K8 : nullptr;
      const TW* wn = w + n * K;
      TY* ym = y + m * N + n;
      const int64_t first = (m / 4) * per_pass;
      const int pf_rows = prefetch ? static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(per_pass, NRMAX - first))) : 0;
      const TW* pf = pfbase + (pf_rows ? first : 0) * ldw;
      if (nr == NRMAX)
        tile_rows_256<NRMAX, PK>(mr, xm, wn, K, ym, N, pf, pf_rows, ldw, stride, xpm);
      else  // the last rows of the share, one at a time
        for (int64_t i = 0; i < nr; ++i)
          tile_rows_256<1, PK>(mr, xm, wn + i * ldw, K, ym + i * stride, N, static_cast<const TW*>(nullptr), 0, ldw, stride, xpm);
    }
  };
  int64_t n = n0;
  if (M > kFarMaxInputs) {  // adjacent rows, x packed, the tile kAhead on prefetched
    for (; n + NRMAX <= n1; n += NRMAX) tiles(std::true_type{}, n, NRMAX, 1, w + (n + kAhead * NRMAX) * K, n + (kAhead + 1) * NRMAX <= n1);
    if (n < n1) tiles(std::true_type{}, n, n1 - n, 1, w, false);
    return;
  }
  while (n1 - n >= NRMAX) {
    const int64_t len = std::min<int64_t>(kStreamBlock, n1 - n) / NRMAX;
    for (int64_t i = 0; i < len; ++i) tiles(std::false_type{}, n + i, NRMAX, len, w + (n + i + kAhead) * K, i + kAhead < len);
    n += len * NRMAX;
  }
  if (n < n1) tiles(std::false_type{}, n, n1 - n, 1, w, false);
}

// The AVX2 ranges cpu_small_linear calls: three weight rows per tile, four ("w") for one or two input rows.
constexpr auto range_f32_256 = &range_256<3, float, float>;
constexpr auto range_wbf16_256 = &range_256<3, uint16_t, uint16_t>;
constexpr auto range_wbf16f_256 = &range_256<3, uint16_t, float>;
constexpr auto range_f32_256w = &range_256<4, float, float>;
constexpr auto range_wbf16_256w = &range_256<4, uint16_t, uint16_t>;
constexpr auto range_wbf16f_256w = &range_256<4, uint16_t, float>;
