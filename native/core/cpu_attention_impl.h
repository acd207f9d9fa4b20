// The fused attention kernels of core/cpu_attention.cc, written once against a vector struct `V` of
// core/simd.h (W float lanes) and included once per instruction set, inside that set's target region
// and namespace (see cpu_attention.cc). No includes here: the including file brings them first.

// bfloat16 -> float32 and float32 as they are, W values.
inline V::F ld(const float* p) { return V::load(p); }
inline V::F ld(const c10::BFloat16* p) { return V::load(reinterpret_cast<const uint16_t*>(p)); }

constexpr int W = V::W;
// Values of a row of V accumulated together by the blocked path: 4 registers of 16 lanes with
// AVX-512, 2 of 8 with AVX2 (16 registers: 4 positions x ND accumulators, ND values and a weight).
constexpr int ND_MAX = W == 16 ? 4 : 2;
constexpr int CH = ND_MAX * W;

// A sequence's own keys and values are read from memory once per decode step, one row after another
// (a row: D values): each loop asks for the row kPrefetchKeys on while it works on this one.
constexpr int64_t kPrefetchKeys = 16;
template <class T>
inline void prefetch_row(const T* p, int64_t D) {
  for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + b, _MM_HINT_T0);
}

// Scores of the listed keys for RR query heads: sc[r * n + key - j0] = q_r·k * scale + mask[key],
// as attend_r computes them one key at a time, KG keys at a time (independent sums, so the
// multiply-adds overlap instead of waiting on one another down a key's D values). Returns how many
// keys it did (whole groups of KG); attend_r does the rest.
template <int RR, class T>
inline int64_t scores_rr(const float* qf, const Keys<T>& kv, const float* mask, float* sc, const int32_t* keys, int64_t nk, int64_t n,
                         int64_t j0, int64_t D, float scale) {
  constexpr int KG = RR == 1 ? 4 : 8 / RR;
  int64_t i = 0;
  for (; i + KG <= nk; i += KG) {
    if (i + kPrefetchKeys + KG <= nk)
#pragma GCC unroll 8
      for (int x = 0; x < KG; ++x) prefetch_row(kv.key(keys[i + kPrefetchKeys + x]), D);
    const T* kp[KG];
#pragma GCC unroll 8
    for (int x = 0; x < KG; ++x) kp[x] = kv.key(keys[i + x]);
    typename V::F s[RR][KG];
#pragma GCC unroll 4
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int x = 0; x < KG; ++x) s[r][x] = V::zero();
    for (int64_t d = 0; d < D; d += W) {
      typename V::F kd[KG];
#pragma GCC unroll 8
      for (int x = 0; x < KG; ++x) kd[x] = ld(kp[x] + d);
#pragma GCC unroll 4
      for (int r = 0; r < RR; ++r) {
        const typename V::F qd = V::load(qf + r * D + d);
#pragma GCC unroll 8
        for (int x = 0; x < KG; ++x) s[r][x] = V::fmadd(qd, kd[x], s[r][x]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int x = 0; x < KG; ++x) {
        const int64_t j = keys[i + x];
        sc[r * n + j - j0] = V::reduce_add(s[r][x]) * scale + mask[j];
      }
  }
  return i;
}

// acc[r][d] += sum over the listed keys, in their order, of p_r(key) v(key)[d], for R query heads:
// one query head at a time, NC vectors of d held in registers across a block of keys (each sum the
// same multiply-adds in the same order as one accumulated in memory), the block's value rows read
// whole and in order by the first head (the hardware prefetchers keep up with that, not with parts
// of rows) and from L1 by the others.
template <class T>
inline void values(const float* sc, const Keys<T>& kv, const int32_t* keys, int64_t nk, int64_t n, int64_t j0, int64_t R, int64_t D,
                   float* acc) {
  constexpr int NC = W == 16 ? 4 : 8;
  constexpr int64_t kBlock = 32;
  for (int64_t i0 = 0; i0 < nk; i0 += kBlock) {
    const int64_t i1 = std::min(nk, i0 + kBlock);
    for (int64_t r = 0; r < R; ++r) {
      const float* pr = sc + r * n - j0;
      int64_t d0 = 0;
      for (; d0 + NC * W <= D; d0 += NC * W) {
        typename V::F a[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) a[c] = V::load(acc + r * D + d0 + c * W);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t j = keys[i];
          if (r == 0 && d0 == 0 && i + kPrefetchKeys < nk) prefetch_row(kv.value(keys[i + kPrefetchKeys]), D);
          const T* vj = kv.value(j) + d0;
          const typename V::F p = V::set1(pr[j]);
#pragma GCC unroll 8
          for (int c = 0; c < NC; ++c) a[c] = V::fmadd(p, ld(vj + c * W), a[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) V::store(acc + r * D + d0 + c * W, a[c]);
      }
      for (; d0 < D; d0 += W) {
        float* ad = acc + r * D + d0;
        typename V::F a = V::load(ad);
        for (int64_t i = i0; i < i1; ++i) a = V::fmadd(V::set1(pr[keys[i]]), ld(kv.value(keys[i]) + d0), a);
        V::store(ad, a);
      }
    }
  }
}

// One query position of the R query heads of one KV head: q (R rows, stride g.q_head), keys and
// values (S positions), mask (S), out (R rows of D, stride g.o_head). `scratch` holds
// attend_scratch(R, S, D) floats. With `st` (a cascade decode), keys [0, j0) were done already:
// st[r * st_r] holds their maximum score, + 1 their sum of exp(score - maximum), + 2.. their
// unnormalised sum of p v; keys [j0, S) are added to that (masked keys are then never read).
// R = 1, 2 or 4 (RR: Qwen3's models and Llama 3.2 1B) has its scores done by scores_rr; any other R
// (Llama 3.2 3B's 3), and the keys left after scores_rr's groups, one key at a time.
inline int64_t attend_scratch(int64_t R, int64_t S, int64_t D) { return R * S + 2 * R * D + R + S; }
template <int RR, class T>
void attend_r(const T* q, const Keys<T>& kv, const float* mask, T* out, const Geometry& g, float* scratch, int64_t j0, const float* st,
              int64_t st_r) {
  const int64_t R = RR ? RR : g.R, S = g.S, D = g.D, n = S - j0;
  constexpr float kLowest = std::numeric_limits<float>::lowest();
  float* sc = scratch;                                  // [R][n] scores, then probabilities (unnormalised)
  float* qf = sc + R * n;                               // [R][D] q in float32
  float* acc = qf + R * D;                              // [R][D] sum of p * v
  float* inv = acc + R * D;                             // [R] 1 / sum of p
  int32_t* keys = reinterpret_cast<int32_t*>(inv + R);  // [n] the keys read
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) qf[r * D + d] = static_cast<float>(q[r * g.q_head + d]);
  // Scores: q·k * scale + mask, as ATen orders it; a masked key keeps the lowest float (its key is not read).
  int64_t unmasked = 0;
  for (int64_t j = j0; j < S; ++j) {
    if (mask[j] == kLowest) {
      for (int64_t r = 0; r < R; ++r) sc[r * n + j - j0] = kLowest;
      continue;
    }
    keys[unmasked++] = static_cast<int32_t>(j);
  }
  int64_t scored = 0;
  if constexpr (RR > 0) scored = scores_rr<RR>(qf, kv, mask, sc, keys, unmasked, n, j0, D, g.scale);
  for (int64_t i = scored; i < unmasked; ++i) {
    const int64_t j = keys[i];
    const T* kj = kv.key(j);
    for (int64_t r = 0; r < R; ++r) {
      typename V::F s = V::zero();
      for (int64_t d = 0; d < D; d += W) s = V::fmadd(V::load(qf + r * D + d), ld(kj + d), s);
      sc[r * n + j - j0] = V::reduce_add(s) * g.scale + mask[j];
    }
  }
  // Softmax per query head (a fully masked row: every score the lowest float, a uniform
  // distribution, as ATen gives). With a prior state, both parts are rescaled to the larger maximum.
  std::memset(acc, 0, sizeof(float) * R * D);
  for (int64_t r = 0; r < R; ++r) {
    float* row = sc + r * n;
    if (!st) {
      const float m = cpu_row_max(row, n);
      inv[r] = static_cast<float>(1.0 / cpu_row_exp(row, n, m, row));
      continue;
    }
    const float* s0 = st + r * st_r;
    const float m = std::max(cpu_row_max(row, n), s0[0]);
    const float c = std::exp(s0[0] - m);
    inv[r] = static_cast<float>(1.0 / (cpu_row_exp(row, n, m, row) + static_cast<double>(s0[1]) * c));
    for (int64_t d = 0; d < D; ++d) acc[r * D + d] = s0[2 + d] * c;
  }
  // out = (sum_j p_j v_j) / sum_j p_j, accumulated in float32. Masked keys are not read (their p is
  // exp(lowest - max): 0, or the vectorised exp's smallest denormal), unless every key is masked.
  int64_t nk = unmasked;
  if (unmasked == 0 && !st) {
    for (int64_t j = j0; j < S; ++j) keys[j - j0] = static_cast<int32_t>(j);
    nk = n;
  }
  values(sc, kv, keys, nk, n, j0, R, D, acc);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) out[r * g.o_head + d] = static_cast<T>(acc[r * D + d] * inv[r]);
}

template <class T>
void attend(const T* q, const Keys<T>& kv, const float* mask, T* out, const Geometry& g, float* scratch, int64_t j0 = 0,
            const float* st = nullptr, int64_t st_r = 0) {
  switch (g.R) {
    case 1:
      return attend_r<1>(q, kv, mask, out, g, scratch, j0, st, st_r);
    case 2:
      return attend_r<2>(q, kv, mask, out, g, scratch, j0, st, st_r);
    case 4:
      return attend_r<4>(q, kv, mask, out, g, scratch, j0, st, st_r);
    default:
      return attend_r<0>(q, kv, mask, out, g, scratch, j0, st, st_r);
  }
}

template <int ND, class T>
inline void weighted_sum(const float* p, int64_t stride, const int32_t* keys, int64_t n, const Keys<T>& kv, int64_t d0, float* acc4,
                         int rows) {
  // acc4[row][W * ND] += sum over the listed keys of p[key * stride + row] * v[key][d0 ..]: 4 rows.
  // (The loops over r and c unrolled, and no accumulator indexed at run time, so they stay in
  // registers: GCC 12 otherwise stored the AVX2 ones to the stack after every multiply-add.)
  typename V::F a[4][ND];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < ND; ++c) a[r][c] = V::zero();
  for (int64_t jj = 0; jj < n; ++jj) {
    const T* vj = kv.value(keys[jj]) + d0;
    typename V::F vv[ND];
#pragma GCC unroll 4
    for (int c = 0; c < ND; ++c) vv[c] = ld(vj + W * c);
    const float* pj = p + jj * stride;
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const typename V::F pr = V::set1(pj[r]);
#pragma GCC unroll 4
      for (int c = 0; c < ND; ++c) a[r][c] = V::fmadd(pr, vv[c], a[r][c]);
    }
  }
  // Every row stored (acc4 has room for 4; the caller reads `rows`): an index known only at run time
  // would keep the accumulators in memory.
  (void)rows;
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < ND; ++c) V::store(acc4 + r * CH + W * c, a[r][c]);
}

// Floats of attend_block's scratch (and as many ints after them): R*D*W (queries) + 8*D (8 keys) +
// R*S*W (scores) + S*W (mask) + 4*CH, then S ints.
inline int64_t block_scratch(int64_t R, int64_t S, int64_t D) { return R * D * W + 8 * D + R * S * W + S * W + 4 * CH + S; }

// Several query positions at once (a prefill): the R query heads x up to W consecutive positions
// of one KV head. The queries are transposed once, [head][d][position], so a score is a column of a
// small GEMM: for each key read, W positions' scores come out of one accumulator with no horizontal
// sum, the mask of W positions is one vector, and the softmax runs across positions in vector lanes.
// Keys masked for every position of the block are not read. Returns false (nothing written) when a
// position has every key masked, which the per-position path handles (uniform, as ATen).
// With `st` (a cascade decode's first phase: lanes are sequences, the keys a prefix they share), the
// block's state is written instead of its output: for lane l and query head r, at st + l * st_l +
// r * st_r, the maximum score, the sum of exp(score - maximum) and the unnormalised sum of p v (D).
template <class T>
bool attend_block(const Block& blk, const Keys<T>& kv, const Geometry& g, float* scratch, float* st = nullptr, int64_t st_l = 0,
                  int64_t st_r = 0) {
  const int64_t R = g.R, S = g.S, D = g.D, L = blk.lanes;
  constexpr float kLowest = std::numeric_limits<float>::lowest();
  const T* q = static_cast<const T*>(blk.q);
  float* qt = scratch;                                       // [R][D][W]
  float* kf = qt + R * D * W;                                // [8][D] keys in float32
  float* sc = kf + 8 * D;                                    // [R][n][W] scores, then probabilities
  float* mt = sc + R * S * W;                                // [n][W] the mask, transposed
  float* acc = mt + S * W;                                   // [4][CH]
  int32_t* keys = reinterpret_cast<int32_t*>(acc + 4 * CH);  // the keys read
  // Which keys any position sees, and the mask transposed to [key][position] (absent lanes: masked).
  int64_t n = 0;
  for (int64_t j = 0; j < S; ++j) {
    bool any = false;
    for (int64_t l = 0; l < L; ++l) any |= blk.mask[l * blk.mask_pos + j] != kLowest;
    if (!any) continue;
    float* m = mt + n * W;
    for (int64_t l = 0; l < W; ++l) m[l] = l < L ? blk.mask[l * blk.mask_pos + j] : kLowest;
    keys[n++] = static_cast<int32_t>(j);
  }
  for (int64_t l = 0; l < L; ++l) {
    bool any = false;
    for (int64_t jj = 0; jj < n && !any; ++jj) any = mt[jj * W + l] != kLowest;
    if (!any) return false;
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t l = 0; l < W; ++l) qt[(r * D + d) * W + l] = l < L ? static_cast<float>(q[l * blk.q_pos + r * g.q_head + d]) : 0.f;
  // Scores, 8 keys at a time: sc[r][jj] = q·k * scale + mask, the lowest float where masked.
  const typename V::F lowest = V::set1(kLowest), scale = V::set1(g.scale);
  for (int64_t j0 = 0; j0 < n; j0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n - j0);
    for (int64_t x = 0; x < 8; ++x)
      for (int64_t d = 0; d < D; d += W) V::store(kf + x * D + d, x < nk ? ld(kv.key(keys[j0 + x]) + d) : V::zero());
    for (int64_t r = 0; r < R; ++r) {
      typename V::F s[8];
#pragma GCC unroll 8
      for (int x = 0; x < 8; ++x) s[x] = V::zero();
      const float* qr = qt + r * D * W;
      for (int64_t d = 0; d < D; ++d) {
        const typename V::F qd = V::load(qr + d * W);
#pragma GCC unroll 8
        for (int x = 0; x < 8; ++x) s[x] = V::fmadd(V::set1(kf[x * D + d]), qd, s[x]);
      }
      // Through a buffer: indexed by the run-time nk, s itself would be kept in memory (see weighted_sum).
      alignas(64) float sb[8][W];
#pragma GCC unroll 8
      for (int x = 0; x < 8; ++x) V::store(sb[x], s[x]);
      for (int64_t x = 0; x < nk; ++x) {
        const typename V::F m = V::load(mt + (j0 + x) * W);
        V::store(sc + (r * n + j0 + x) * W, V::keep_lowest(m, V::fmadd(V::load(sb[x]), scale, m)));
      }
    }
  }
  // Softmax across keys, W positions per vector; masked entries get probability 0.
  const int64_t o_head = g.o_head;
  T* out = static_cast<T*>(blk.out);
  for (int64_t r = 0; r < R; ++r) {
    float* sr = sc + r * n * W;
    typename V::F mx = lowest;
    for (int64_t jj = 0; jj < n; ++jj) mx = V::max(mx, V::load(sr + jj * W));
    typename V::F z = V::zero();
    for (int64_t jj = 0; jj < n; ++jj) {
      const typename V::F x = V::load(sr + jj * W);
      const typename V::F p = V::zero_lowest(x, V::exp(V::sub(x, mx)));
      V::store(sr + jj * W, p);
      z = V::add(z, p);
    }
    alignas(64) float inv[W];
    V::store(inv, V::div(V::set1(1.f), z));
    if (st) {  // the state instead of the output: maximum, sum, unnormalised sum of p v
      alignas(64) float mxs[W], zs[W];
      V::store(mxs, mx);
      V::store(zs, z);
      for (int64_t l = 0; l < L; ++l) st[l * st_l + r * st_r] = mxs[l], st[l * st_l + r * st_r + 1] = zs[l];
    }
    // out[position] = sum_j p_j v_j / z, 4 positions x CH values at a time.
    for (int64_t l0 = 0; l0 < L; l0 += 4) {
      const int rows = static_cast<int>(std::min<int64_t>(4, L - l0));
      for (int64_t d0 = 0; d0 < D; d0 += CH) {
        const int64_t nd = std::min<int64_t>(CH, D - d0) / W;
        if constexpr (ND_MAX == 4) {
          if (nd == 4)
            weighted_sum<4>(sr + l0, W, keys, n, kv, d0, acc, rows);
          else if (nd == 3)
            weighted_sum<3>(sr + l0, W, keys, n, kv, d0, acc, rows);
          else if (nd == 2)
            weighted_sum<2>(sr + l0, W, keys, n, kv, d0, acc, rows);
          else
            weighted_sum<1>(sr + l0, W, keys, n, kv, d0, acc, rows);
        } else {
          if (nd == 2)
            weighted_sum<2>(sr + l0, W, keys, n, kv, d0, acc, rows);
          else
            weighted_sum<1>(sr + l0, W, keys, n, kv, d0, acc, rows);
        }
        for (int r4 = 0; r4 < rows; ++r4) {
          if (st) {
            std::memcpy(st + (l0 + r4) * st_l + r * st_r + 2 + d0, acc + r4 * CH, sizeof(float) * nd * W);
            continue;
          }
          T* o = out + (l0 + r4) * blk.o_pos + r * o_head + d0;
          for (int64_t d = 0; d < nd * W; ++d) o[d] = static_cast<T>(acc[r4 * CH + d] * inv[l0 + r4]);
        }
      }
    }
  }
  return true;
}

template <class E>
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pk, const at::Tensor& pv,
               const at::Tensor& mask, double scale) {
  const int64_t B = q.size(0), nq = q.size(1), T = q.size(2), D = q.size(3), nkv = k.size(1);
  const int64_t P = pk.defined() ? pk.size(2) : 0, S = P + k.size(2);
  auto out = at::empty({B, nq, T, D}, q.options());
  const Geometry g{nq / nkv, S, D, q.stride(1), T * D, static_cast<float>(scale)};
  const E* qp = q.data_ptr<E>();
  const float* mp = mask.data_ptr<float>();
  E* op = out.data_ptr<E>();
  const auto keys = [&](int64_t b, int64_t h) {
    Keys<E> kv{nullptr,
               nullptr,
               P,
               0,
               0,
               k.data_ptr<E>() + b * k.stride(0) + h * k.stride(1),
               v.data_ptr<E>() + b * v.stride(0) + h * v.stride(1),
               k.stride(2),
               v.stride(2)};
    if (P > 0) {
      kv.pk = pk.data_ptr<E>() + h * pk.stride(1), kv.pv = pv.data_ptr<E>() + h * pv.stride(1);
      kv.pk_pos = pk.stride(2), kv.pv_pos = pv.stride(2);
    }
    return kv;
  };
  const auto one = [&](int64_t b, int64_t h, int64_t t, float* scratch) {
    attend<E>(qp + b * q.stride(0) + h * g.R * q.stride(1) + t * q.stride(2), keys(b, h), mp + b * mask.stride(0) + t * mask.stride(2),
              op + ((b * nq + h * g.R) * T + t) * D, g, scratch);
  };
  const int64_t one_scratch = attend_scratch(g.R, S, D);
  // Tasks go KV head by KV head, so that consecutive sequences read a shared prefix from cache.
  if (T == 1 && P > 0 && B > 1) {
    // A decode step with a shared prefix (cascade): first the prefix for W sequences at a time, as
    // a small GEMM (the block path with sequences for lanes), keeping each one's softmax state; then
    // each sequence's own keys, added to it. A block with a sequence that sees no prefix key runs the
    // one-pass path for its sequences.
    const int64_t nb = (B + W - 1) / W, st_r = D + 2, st_b = g.R * st_r;
    std::vector<float> state(nkv * B * st_b);
    std::vector<uint8_t> whole(nkv * nb, 0);
    Geometry gp = g;
    gp.S = P;
    at::parallel_for(0, nkv * nb, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scratch(block_scratch(g.R, P, D));
      for (int64_t i = t0; i < t1; ++i) {
        const int64_t h = i / nb, b0 = (i % nb) * W, lanes = std::min<int64_t>(W, B - b0);
        const Block blk{
            qp + b0 * q.stride(0) + h * g.R * q.stride(1), q.stride(0), mp + b0 * mask.stride(0), mask.stride(0), nullptr, 0, lanes};
        whole[i] = !attend_block<E>(blk, keys(b0, h), gp, scratch.data(), state.data() + (h * B + b0) * st_b, st_b, st_r);
      }
    });
    at::parallel_for(0, B * nkv, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scratch(one_scratch);
      for (int64_t i = t0; i < t1; ++i) {
        const int64_t h = i / B, b = i % B;
        if (whole[h * nb + b / W]) {
          one(b, h, 0, scratch.data());
          continue;
        }
        attend<E>(qp + b * q.stride(0) + h * g.R * q.stride(1), keys(b, h), mp + b * mask.stride(0), op + (b * nq + h * g.R) * D, g,
                  scratch.data(), P, state.data() + (h * B + b) * st_b, st_r);
      }
    });
    return out;
  }
  if (T < kBlockFrom) {
    // One task per (KV head, sequence, query position).
    at::parallel_for(0, B * nkv * T, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scratch(one_scratch);
      for (int64_t i = t0; i < t1; ++i) one((i / T) % B, i / (B * T), i % T, scratch.data());
    });
    return out;
  }
  // A prefill: one task per (KV head, sequence, block of W positions).
  const int64_t nb = (T + W - 1) / W;
  at::parallel_for(0, B * nkv * nb, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(std::max(block_scratch(g.R, S, D), one_scratch));
    for (int64_t i = t0; i < t1; ++i) {
      const int64_t h = i / (B * nb), b = (i / nb) % B, p0 = (i % nb) * W, lanes = std::min<int64_t>(W, T - p0);
      const Block blk{qp + b * q.stride(0) + h * g.R * q.stride(1) + p0 * q.stride(2),
                      q.stride(2),
                      mp + b * mask.stride(0) + p0 * mask.stride(2),
                      mask.stride(2),
                      op + ((b * nq + h * g.R) * T + p0) * D,
                      D,
                      lanes};
      if (!attend_block<E>(blk, keys(b, h), g, scratch.data()))
        for (int64_t t = p0; t < p0 + lanes; ++t) one(b, h, t, scratch.data());
    }
  });
  return out;
}
