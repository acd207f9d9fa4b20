// Fused attention of generation on the CPU (see cpu_attention.h).
#include "core/cpu_attention.h"

#include "core/cpu_gemm.h"
#include "core/cpu_vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace slm {

#ifdef SLM_CPU_VEC_X86
namespace {

#define T512 __attribute__((target("avx512f,avx512bw")))

T512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
T512 inline __m512 load16(const c10::BFloat16* p) {  // bfloat16 -> float32: the 16 bits on top
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// From this many query positions on, a call runs the blocked (prefill) path.
constexpr int64_t kBlockFrom = 4;

struct Geometry {
  int64_t R, S, D;
  int64_t q_head, o_head;  // strides between query heads in q and in the output
  float scale;
};

// One KV head's keys and values of one sequence: positions [0, P) from the prefix shared by every
// sequence of the batch (cascade: all rows read the same memory, which stays in cache), [P, S) from
// the sequence's own cache rows.
template <class T>
struct Keys {
  const T *pk, *pv;  // the shared prefix (P rows)
  int64_t P, pk_pos, pv_pos;
  const T *k, *v;  // the sequence's own rows
  int64_t k_pos, v_pos;
  const T* key(int64_t j) const { return j < P ? pk + j * pk_pos : k + (j - P) * k_pos; }
  const T* value(int64_t j) const { return j < P ? pv + j * pv_pos : v + (j - P) * v_pos; }
};

// One query position of the R query heads of one KV head: q (R rows, stride g.q_head), keys and
// values (S positions), mask (S), out (R rows of D, stride g.o_head). `scratch` holds R*S + 2*R*D + R
// floats. With `st` (a cascade decode), keys [0, j0) were done already: st[r * st_r] holds their
// maximum score, + 1 their sum of exp(score - maximum), + 2.. their unnormalised sum of p v; keys
// [j0, S) are added to that (masked keys are then never read).
template <class T>
T512 void attend(const T* q, const Keys<T>& kv, const float* mask, T* out, const Geometry& g, float* scratch, int64_t j0 = 0, const float* st = nullptr,
                 int64_t st_r = 0) {
  const int64_t R = g.R, S = g.S, D = g.D, n = S - j0;
  constexpr float kLowest = std::numeric_limits<float>::lowest();
  float* sc = scratch;        // [R][n] scores, then probabilities (unnormalised)
  float* qf = sc + R * n;     // [R][D] q in float32
  float* acc = qf + R * D;    // [R][D] sum of p * v
  float* inv = acc + R * D;   // [R] 1 / sum of p
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) qf[r * D + d] = static_cast<float>(q[r * g.q_head + d]);
  // Scores: q·k * scale + mask, as ATen orders it; a masked key keeps the lowest float (its key is not read).
  int64_t unmasked = 0;
  for (int64_t j = j0; j < S; ++j) {
    if (mask[j] == kLowest) {
      for (int64_t r = 0; r < R; ++r) sc[r * n + j - j0] = kLowest;
      continue;
    }
    ++unmasked;
    const T* kj = kv.key(j);
    for (int64_t r = 0; r < R; ++r) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(qf + r * D + d), load16(kj + d), s);
      sc[r * n + j - j0] = _mm512_reduce_add_ps(s) * g.scale + mask[j];
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
  for (int64_t j = j0; j < S; ++j) {
    if ((unmasked > 0 || st) && mask[j] == kLowest) continue;
    const T* vj = kv.value(j);
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 vv = load16(vj + d);
      for (int64_t r = 0; r < R; ++r) {
        float* a = acc + r * D + d;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(sc[r * n + j - j0]), vv, _mm512_loadu_ps(a)));
      }
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) out[r * g.o_head + d] = static_cast<T>(acc[r * D + d] * inv[r]);
}

// Several query positions at once (a prefill): the R query heads x up to 16 consecutive positions
// of one KV head. The queries are transposed once, [head][d][position], so a score is a column of a
// small GEMM: for each key read, 16 positions' scores come out of one accumulator with no horizontal
// sum, the mask of 16 positions is one vector, and the softmax runs across positions in vector lanes.
// Keys masked for every position of the block are not read. `lanes` <= 16 positions; `qpos` etc. are
// the pointers of position 0 of query head 0; returns false (nothing written) when a position has
// every key masked, which the per-position path handles (uniform, as ATen).
struct Block {
  const void* q;  // position 0, query head 0
  int64_t q_pos;  // stride between positions in q
  const float* mask;  // position 0's mask row
  int64_t mask_pos;
  void* out;      // position 0, query head 0
  int64_t o_pos;
  int64_t lanes;
};

template <int ND, class T>
T512 inline void weighted_sum(const float* p, int64_t stride, const int32_t* keys, int64_t n, const Keys<T>& kv, int64_t d0, float* acc4, int rows) {
  // acc4[row][16 * ND] += sum over the listed keys of p[key * stride + row] * v[key][d0 ..]: 4 rows.
  __m512 a[4][ND];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < ND; ++c) a[r][c] = _mm512_setzero_ps();
  for (int64_t jj = 0; jj < n; ++jj) {
    const T* vj = kv.value(keys[jj]) + d0;
    __m512 vv[ND];
    for (int c = 0; c < ND; ++c) vv[c] = load16(vj + 16 * c);
    const float* pj = p + jj * stride;
    for (int r = 0; r < 4; ++r) {
      const __m512 pr = _mm512_set1_ps(pj[r]);
      for (int c = 0; c < ND; ++c) a[r][c] = _mm512_fmadd_ps(pr, vv[c], a[r][c]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < ND; ++c) _mm512_storeu_ps(acc4 + r * 64 + 16 * c, a[r][c]);
}

// `scratch` holds R*D*16 (queries) + 16*D (8 keys) + R*S*16 (scores) + S*16 (mask) + 16*64 floats and S ints.
// With `st` (a cascade decode's first phase: lanes are sequences, the keys a prefix they share), the
// block's state is written instead of its output: for lane l and query head r, at st + l * st_l +
// r * st_r, the maximum score, the sum of exp(score - maximum) and the unnormalised sum of p v (D).
template <class T>
T512 bool attend_block(const Block& blk, const Keys<T>& kv, const Geometry& g, float* scratch, float* st = nullptr, int64_t st_l = 0, int64_t st_r = 0) {
  const int64_t R = g.R, S = g.S, D = g.D, L = blk.lanes;
  constexpr float kLowest = std::numeric_limits<float>::lowest();
  const T* q = static_cast<const T*>(blk.q);
  float* qt = scratch;             // [R][D][16]
  float* kf = qt + R * D * 16;     // [8][D] keys in float32
  float* sc = kf + 8 * D;          // [R][n][16] scores, then probabilities
  float* mt = sc + R * S * 16;     // [n][16] the mask, transposed
  float* acc = mt + S * 16;        // [4][64]
  int32_t* keys = reinterpret_cast<int32_t*>(acc + 4 * 64);  // the keys read
  // Which keys any position sees, and the mask transposed to [key][position] (absent lanes: masked).
  int64_t n = 0;
  for (int64_t j = 0; j < S; ++j) {
    bool any = false;
    for (int64_t l = 0; l < L; ++l) any |= blk.mask[l * blk.mask_pos + j] != kLowest;
    if (!any) continue;
    float* m = mt + n * 16;
    for (int64_t l = 0; l < 16; ++l) m[l] = l < L ? blk.mask[l * blk.mask_pos + j] : kLowest;
    keys[n++] = static_cast<int32_t>(j);
  }
  for (int64_t l = 0; l < L; ++l) {
    bool any = false;
    for (int64_t jj = 0; jj < n && !any; ++jj) any = mt[jj * 16 + l] != kLowest;
    if (!any) return false;
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t l = 0; l < 16; ++l) qt[(r * D + d) * 16 + l] = l < L ? static_cast<float>(q[l * blk.q_pos + r * g.q_head + d]) : 0.f;
  // Scores, 8 keys at a time: sc[r][jj] = q·k * scale + mask, the lowest float where masked.
  const __m512 lowest = _mm512_set1_ps(kLowest), scale = _mm512_set1_ps(g.scale);
  for (int64_t j0 = 0; j0 < n; j0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n - j0);
    for (int64_t x = 0; x < 8; ++x)
      for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(kf + x * D + d, x < nk ? load16(kv.key(keys[j0 + x]) + d) : _mm512_setzero_ps());
    for (int64_t r = 0; r < R; ++r) {
      __m512 s[8];
      for (int x = 0; x < 8; ++x) s[x] = _mm512_setzero_ps();
      const float* qr = qt + r * D * 16;
      for (int64_t d = 0; d < D; ++d) {
        const __m512 qd = _mm512_loadu_ps(qr + d * 16);
        for (int x = 0; x < 8; ++x) s[x] = _mm512_fmadd_ps(_mm512_set1_ps(kf[x * D + d]), qd, s[x]);
      }
      for (int64_t x = 0; x < nk; ++x) {
        const __m512 m = _mm512_loadu_ps(mt + (j0 + x) * 16);
        const __m512 val = _mm512_fmadd_ps(s[x], scale, m);
        _mm512_storeu_ps(sc + (r * n + j0 + x) * 16, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, lowest, _CMP_EQ_OQ), val, lowest));
      }
    }
  }
  // Softmax across keys, 16 positions per vector; masked entries get probability 0.
  const int64_t o_head = g.o_head;
  T* out = static_cast<T*>(blk.out);
  for (int64_t r = 0; r < R; ++r) {
    float* sr = sc + r * n * 16;
    __m512 mx = lowest;
    for (int64_t jj = 0; jj < n; ++jj) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + jj * 16));
    __m512 z = _mm512_setzero_ps();
    for (int64_t jj = 0; jj < n; ++jj) {
      const __m512 x = _mm512_loadu_ps(sr + jj * 16);
      const __m512 p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lowest, _CMP_NEQ_OQ), exp512(_mm512_sub_ps(x, mx)));
      _mm512_storeu_ps(sr + jj * 16, p);
      z = _mm512_add_ps(z, p);
    }
    alignas(64) float inv[16];
    _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), z));
    if (st) {  // the state instead of the output: maximum, sum, unnormalised sum of p v
      alignas(64) float mxs[16], zs[16];
      _mm512_store_ps(mxs, mx);
      _mm512_store_ps(zs, z);
      for (int64_t l = 0; l < L; ++l) st[l * st_l + r * st_r] = mxs[l], st[l * st_l + r * st_r + 1] = zs[l];
    }
    // out[position] = sum_j p_j v_j / z, 4 positions x 64 values at a time.
    for (int64_t l0 = 0; l0 < L; l0 += 4) {
      const int rows = static_cast<int>(std::min<int64_t>(4, L - l0));
      for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int64_t nd = std::min<int64_t>(64, D - d0) / 16;
        if (nd == 4) weighted_sum<4>(sr + l0, 16, keys, n, kv, d0, acc, rows);
        else if (nd == 3) weighted_sum<3>(sr + l0, 16, keys, n, kv, d0, acc, rows);
        else if (nd == 2) weighted_sum<2>(sr + l0, 16, keys, n, kv, d0, acc, rows);
        else weighted_sum<1>(sr + l0, 16, keys, n, kv, d0, acc, rows);
        for (int r4 = 0; r4 < rows; ++r4) {
          if (st) {
            std::memcpy(st + (l0 + r4) * st_l + r * st_r + 2 + d0, acc + r4 * 64, sizeof(float) * nd * 16);
            continue;
          }
          T* o = out + (l0 + r4) * blk.o_pos + r * o_head + d0;
          for (int64_t d = 0; d < nd * 16; ++d) o[d] = static_cast<T>(acc[r4 * 64 + d] * inv[l0 + r4]);
        }
      }
    }
  }
  return true;
}

template <class E>
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pk, const at::Tensor& pv, const at::Tensor& mask, double scale) {
  const int64_t B = q.size(0), nq = q.size(1), T = q.size(2), D = q.size(3), nkv = k.size(1);
  const int64_t P = pk.defined() ? pk.size(2) : 0, S = P + k.size(2);
  auto out = at::empty({B, nq, T, D}, q.options());
  const Geometry g{nq / nkv, S, D, q.stride(1), T * D, static_cast<float>(scale)};
  const E* qp = q.data_ptr<E>();
  const float* mp = mask.data_ptr<float>();
  E* op = out.data_ptr<E>();
  const auto keys = [&](int64_t b, int64_t h) {
    Keys<E> kv{nullptr, nullptr, P, 0, 0, k.data_ptr<E>() + b * k.stride(0) + h * k.stride(1), v.data_ptr<E>() + b * v.stride(0) + h * v.stride(1), k.stride(2), v.stride(2)};
    if (P > 0) {
      kv.pk = pk.data_ptr<E>() + h * pk.stride(1), kv.pv = pv.data_ptr<E>() + h * pv.stride(1);
      kv.pk_pos = pk.stride(2), kv.pv_pos = pv.stride(2);
    }
    return kv;
  };
  const auto one = [&](int64_t b, int64_t h, int64_t t, float* scratch) {
    attend<E>(qp + b * q.stride(0) + h * g.R * q.stride(1) + t * q.stride(2), keys(b, h), mp + b * mask.stride(0) + t * mask.stride(2), op + ((b * nq + h * g.R) * T + t) * D, g, scratch);
  };
  // Tasks go KV head by KV head, so that consecutive sequences read a shared prefix from cache.
  if (T == 1 && P > 0 && B > 1) {
    // A decode step with a shared prefix (cascade): first the prefix for 16 sequences at a time, as
    // a small GEMM (the block path with sequences for lanes), keeping each one's softmax state; then
    // each sequence's own keys, added to it. A block with a sequence that sees no prefix key runs the
    // one-pass path for its sequences.
    const int64_t nb = (B + 15) / 16, st_r = D + 2, st_b = g.R * st_r;
    std::vector<float> state(nkv * B * st_b);
    std::vector<uint8_t> whole(nkv * nb, 0);
    Geometry gp = g;
    gp.S = P;
    at::parallel_for(0, nkv * nb, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scratch(g.R * D * 16 + 16 * D + g.R * P * 16 + P * 16 + 16 * 64 + P);
      for (int64_t i = t0; i < t1; ++i) {
        const int64_t h = i / nb, b0 = (i % nb) * 16, lanes = std::min<int64_t>(16, B - b0);
        const Block blk{qp + b0 * q.stride(0) + h * g.R * q.stride(1), q.stride(0), mp + b0 * mask.stride(0), mask.stride(0), nullptr, 0, lanes};
        whole[i] = !attend_block<E>(blk, keys(b0, h), gp, scratch.data(), state.data() + (h * B + b0) * st_b, st_b, st_r);
      }
    });
    at::parallel_for(0, B * nkv, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scratch(g.R * S + 2 * g.R * D + g.R);
      for (int64_t i = t0; i < t1; ++i) {
        const int64_t h = i / B, b = i % B;
        if (whole[h * nb + b / 16]) {
          one(b, h, 0, scratch.data());
          continue;
        }
        attend<E>(qp + b * q.stride(0) + h * g.R * q.stride(1), keys(b, h), mp + b * mask.stride(0), op + (b * nq + h * g.R) * D, g, scratch.data(), P,
                  state.data() + (h * B + b) * st_b, st_r);
      }
    });
    return out;
  }
  if (T < kBlockFrom) {
    // One task per (KV head, sequence, query position).
    at::parallel_for(0, B * nkv * T, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scratch(g.R * S + 2 * g.R * D + g.R);
      for (int64_t i = t0; i < t1; ++i) one((i / T) % B, i / (B * T), i % T, scratch.data());
    });
    return out;
  }
  // A prefill: one task per (KV head, sequence, block of 16 positions).
  const int64_t nb = (T + 15) / 16;
  at::parallel_for(0, B * nkv * nb, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(std::max(g.R * D * 16 + 16 * D + g.R * S * 16 + S * 16 + 16 * 64 + S, g.R * S + 2 * g.R * D + g.R));
    for (int64_t i = t0; i < t1; ++i) {
      const int64_t h = i / (B * nb), b = (i / nb) % B, p0 = (i % nb) * 16, lanes = std::min<int64_t>(16, T - p0);
      const Block blk{qp + b * q.stride(0) + h * g.R * q.stride(1) + p0 * q.stride(2), q.stride(2), mp + b * mask.stride(0) + p0 * mask.stride(2), mask.stride(2),
                      op + ((b * nq + h * g.R) * T + p0) * D, D, lanes};
      if (!attend_block<E>(blk, keys(b, h), g, scratch.data()))
        for (int64_t t = p0; t < p0 + lanes; ++t) one(b, h, t, scratch.data());
    }
  });
  return out;
}

}  // namespace
#endif

at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale, const at::Tensor& pk, const at::Tensor& pv) {
#ifdef SLM_CPU_VEC_X86
  if (!cpu_kernels_enabled() || !cpu_has_avx512() || !q.device().is_cpu()) return {};
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || mask.dim() != 4) return {};
  const auto dt = q.scalar_type();
  if ((dt != at::kFloat && dt != at::kBFloat16) || k.scalar_type() != dt || v.scalar_type() != dt || mask.scalar_type() != at::kFloat) return {};
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const int64_t B = q.size(0), nq = q.size(1), D = q.size(3), nkv = k.size(1), S = k.size(2);
  if (D % 16 != 0 || nkv == 0 || nq % nkv != 0 || k.size(0) != B || v.size(0) != B || v.size(1) != nkv || v.size(2) != S || k.size(3) != D || v.size(3) != D) return {};
  const int64_t P = pk.defined() ? pk.size(2) : 0;
  if (pk.defined() != pv.defined()) return {};
  if (pk.defined() && (pk.dim() != 4 || pv.dim() != 4 || pk.size(0) != 1 || pv.size(0) != 1 || pk.size(1) != nkv || pv.size(1) != nkv || pv.size(2) != P ||
                       pk.size(3) != D || pv.size(3) != D || pk.scalar_type() != dt || pv.scalar_type() != dt || pk.stride(3) != 1 || pv.stride(3) != 1 || !pk.device().is_cpu()))
    return {};
  if (mask.size(0) != B || mask.size(1) != 1 || mask.size(2) != q.size(2) || mask.size(3) != P + S || q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1 || mask.stride(3) != 1) return {};
  return dt == at::kFloat ? run<float>(q, k, v, pk, pv, mask, scale) : run<c10::BFloat16>(q, k, v, pk, pv, mask, scale);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)scale, (void)pk, (void)pv;
  return {};
#endif
}

const char* cpu_attention_isa() {
#ifdef SLM_CPU_VEC_X86
  if (cpu_has_avx512()) return "avx512 (float32, bfloat16)";
#endif
  return "none";
}

}  // namespace slm
