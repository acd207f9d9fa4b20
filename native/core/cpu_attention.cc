// Fused attention of generation on the CPU (see cpu_attention.h).
#include "core/cpu_attention.h"

#include "core/cpu_gemm.h"
#include "core/cpu_isa.h"
#include "core/cpu_vec.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace slm {

#ifdef SLM_CPU_VEC_X86
namespace {

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

// A block of query positions (a prefill) or of sequences (a cascade decode's shared prefix), for
// attend_block: pointers of position 0 of query head 0, and `lanes` (at most the vector width) rows.
struct Block {
  const void* q;      // position 0, query head 0
  int64_t q_pos;      // stride between positions in q
  const float* mask;  // position 0's mask row
  int64_t mask_pos;
  void* out;  // position 0, query head 0
  int64_t o_pos;
  int64_t lanes;
};

}  // namespace

// The kernels, once per instruction set (core/simd.h).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
namespace k512 {
using V = simd::V16;
#include "core/cpu_attention_impl.h"
}  // namespace k512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace k256 {
using V = simd::V8;
#include "core/cpu_attention_impl.h"
}  // namespace k256
#pragma GCC pop_options
#endif

at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
                         const at::Tensor& pk, const at::Tensor& pv) {
#ifdef SLM_CPU_VEC_X86
  const CpuIsa isa = cpu_isa();
  if (!cpu_kernels_enabled() || isa == CpuIsa::None || !q.device().is_cpu()) return {};
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || mask.dim() != 4) return {};
  const auto dt = q.scalar_type();
  if ((dt != at::kFloat && dt != at::kBFloat16) || k.scalar_type() != dt || v.scalar_type() != dt || mask.scalar_type() != at::kFloat)
    return {};
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const int64_t B = q.size(0), nq = q.size(1), D = q.size(3), nkv = k.size(1), S = k.size(2);
  if (D % 16 != 0 || nkv == 0 || nq % nkv != 0 || k.size(0) != B || v.size(0) != B || v.size(1) != nkv || v.size(2) != S ||
      k.size(3) != D || v.size(3) != D)
    return {};
  const int64_t P = pk.defined() ? pk.size(2) : 0;
  if (pk.defined() != pv.defined()) return {};
  if (pk.defined() && (pk.dim() != 4 || pv.dim() != 4 || pk.size(0) != 1 || pv.size(0) != 1 || pk.size(1) != nkv || pv.size(1) != nkv ||
                       pv.size(2) != P || pk.size(3) != D || pv.size(3) != D || pk.scalar_type() != dt || pv.scalar_type() != dt ||
                       pk.stride(3) != 1 || pv.stride(3) != 1 || !pk.device().is_cpu()))
    return {};
  if (mask.size(0) != B || mask.size(1) != 1 || mask.size(2) != q.size(2) || mask.size(3) != P + S || q.stride(3) != 1 ||
      k.stride(3) != 1 || v.stride(3) != 1 || mask.stride(3) != 1)
    return {};
  if (isa >= CpuIsa::Avx512)
    return dt == at::kFloat ? k512::run<float>(q, k, v, pk, pv, mask, scale) : k512::run<c10::BFloat16>(q, k, v, pk, pv, mask, scale);
  return dt == at::kFloat ? k256::run<float>(q, k, v, pk, pv, mask, scale) : k256::run<c10::BFloat16>(q, k, v, pk, pv, mask, scale);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)scale, (void)pk, (void)pv;
  return {};
#endif
}

const char* cpu_attention_isa() {
#ifdef SLM_CPU_VEC_X86
  switch (cpu_isa()) {
    case CpuIsa::Avx512Bf16:
    case CpuIsa::Avx512:
      return "avx512 (float32, bfloat16)";
    case CpuIsa::Avx2:
      return "avx2 (float32, bfloat16)";
    default:
      break;
  }
#endif
  return "none";
}

}  // namespace slm
