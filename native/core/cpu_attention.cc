// Fused attention of generation on the CPU (see cpu_attention.h).
#include "core/cpu_attention.h"

#include "core/cpu_gemm.h"
#include "core/cpu_vec.h"

#include <ATen/Parallel.h>

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

struct Geometry {
  int64_t R, S, D;
  int64_t q_head, o_head;  // strides between query heads in q and in the output
  int64_t k_pos, v_pos;    // strides between positions
  float scale;
};

// One query position of the R query heads of one KV head: q (R rows, stride g.q_head), k/v (S
// rows), mask (S), out (R rows of D, stride g.o_head). `scratch` holds R*S + 2*R*D + R floats.
template <class T>
T512 void attend(const T* q, const T* k, const T* v, const float* mask, T* out, const Geometry& g, float* scratch) {
  const int64_t R = g.R, S = g.S, D = g.D;
  constexpr float kLowest = std::numeric_limits<float>::lowest();
  float* sc = scratch;        // [R][S] scores, then probabilities (unnormalised)
  float* qf = sc + R * S;     // [R][D] q in float32
  float* acc = qf + R * D;    // [R][D] sum of p * v
  float* inv = acc + R * D;   // [R] 1 / sum of p
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) qf[r * D + d] = static_cast<float>(q[r * g.q_head + d]);
  // Scores: q·k * scale + mask, as ATen orders it; a masked key keeps the lowest float (its key is not read).
  int64_t unmasked = 0;
  for (int64_t j = 0; j < S; ++j) {
    if (mask[j] == kLowest) {
      for (int64_t r = 0; r < R; ++r) sc[r * S + j] = kLowest;
      continue;
    }
    ++unmasked;
    const T* kj = k + j * g.k_pos;
    for (int64_t r = 0; r < R; ++r) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(qf + r * D + d), load16(kj + d), s);
      sc[r * S + j] = _mm512_reduce_add_ps(s) * g.scale + mask[j];
    }
  }
  // Softmax per query head (a fully masked row: every score the lowest float, a uniform
  // distribution, as ATen gives).
  for (int64_t r = 0; r < R; ++r) {
    float* row = sc + r * S;
    const float m = cpu_row_max(row, S);
    inv[r] = static_cast<float>(1.0 / cpu_row_exp(row, S, m, row));
  }
  // out = (sum_j p_j v_j) / sum_j p_j, accumulated in float32. Masked keys are not read (their p is
  // exp(lowest - max): 0, or the vectorised exp's smallest denormal), unless every key is masked.
  std::memset(acc, 0, sizeof(float) * R * D);
  for (int64_t j = 0; j < S; ++j) {
    if (unmasked > 0 && mask[j] == kLowest) continue;
    const T* vj = v + j * g.v_pos;
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 vv = load16(vj + d);
      for (int64_t r = 0; r < R; ++r) {
        float* a = acc + r * D + d;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(sc[r * S + j]), vv, _mm512_loadu_ps(a)));
      }
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) out[r * g.o_head + d] = static_cast<T>(acc[r * D + d] * inv[r]);
}

template <class E>
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale) {
  const int64_t B = q.size(0), nq = q.size(1), T = q.size(2), D = q.size(3), nkv = k.size(1), S = k.size(2);
  auto out = at::empty({B, nq, T, D}, q.options());
  const Geometry g{nq / nkv, S, D, q.stride(1), T * D, k.stride(2), v.stride(2), static_cast<float>(scale)};
  const E* qp = q.data_ptr<E>();
  const E* kp = k.data_ptr<E>();
  const E* vp = v.data_ptr<E>();
  const float* mp = mask.data_ptr<float>();
  E* op = out.data_ptr<E>();
  // One task per (sequence, KV head, query position); a KV head's keys stay in L2 across its positions.
  at::parallel_for(0, B * nkv * T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(g.R * S + 2 * g.R * D + g.R);
    for (int64_t i = t0; i < t1; ++i) {
      const int64_t b = i / (nkv * T), h = (i / T) % nkv, t = i % T;
      attend<E>(qp + b * q.stride(0) + h * g.R * q.stride(1) + t * q.stride(2), kp + b * k.stride(0) + h * k.stride(1), vp + b * v.stride(0) + h * v.stride(1),
                mp + b * mask.stride(0) + t * mask.stride(2), op + ((b * nq + h * g.R) * T + t) * D, g, scratch.data());
    }
  });
  return out;
}

}  // namespace
#endif

at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale) {
#ifdef SLM_CPU_VEC_X86
  if (!cpu_kernels_enabled() || !cpu_has_avx512() || !q.device().is_cpu()) return {};
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || mask.dim() != 4) return {};
  const auto dt = q.scalar_type();
  if ((dt != at::kFloat && dt != at::kBFloat16) || k.scalar_type() != dt || v.scalar_type() != dt || mask.scalar_type() != at::kFloat) return {};
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const int64_t B = q.size(0), nq = q.size(1), D = q.size(3), nkv = k.size(1), S = k.size(2);
  if (D % 16 != 0 || nkv == 0 || nq % nkv != 0 || k.size(0) != B || v.size(0) != B || v.size(1) != nkv || v.size(2) != S || k.size(3) != D || v.size(3) != D) return {};
  if (mask.size(0) != B || mask.size(1) != 1 || mask.size(2) != q.size(2) || mask.size(3) != S || q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1 || mask.stride(3) != 1) return {};
  return dt == at::kFloat ? run<float>(q, k, v, mask, scale) : run<c10::BFloat16>(q, k, v, mask, scale);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)scale;
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
