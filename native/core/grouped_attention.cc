// Grouped-query attention as ATen operations (and the fused CPU kernel where it applies): see
// grouped_attention in core/qwen3.h.
#include <ATen/ATen.h>
#include <torch/csrc/api/include/torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu_attention.h"
#include "core/qwen3.h"

namespace slm {

namespace {

constexpr int64_t kCausalBlock = 128;

// For each block of `block` query rows: one past the last key any of its rows sees (mask [B, 1, T, S],
// additive: 0 seen, the lowest float masked), or S when a row of the block sees none.
std::vector<int64_t> causal_key_ends(const at::Tensor& mask, int64_t block, int64_t T, int64_t S) {
  const auto m = mask.to(at::kFloat).expand({mask.size(0), 1, T, S}).contiguous();
  const float* p = m.data_ptr<float>();
  const int64_t B = m.size(0);
  std::vector<int64_t> ends;
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    int64_t end = 0;
    for (int64_t b = 0; b < B && end < S; ++b)
      for (int64_t t = t0; t < std::min(T, t0 + block) && end < S; ++t) {
        const float* row = p + (b * T + t) * S;
        int64_t j = S;
        while (j > 0 && row[j - 1] < -1e30f) --j;
        end = std::max(end, j == 0 ? S : j);
      }
    ends.push_back(end);
  }
  return ends;
}

}  // namespace

at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& K_rows, const at::Tensor& V_rows, const at::Tensor& mask, bool kernels,
                             const at::Tensor& pk, const at::Tensor& pv) {
  const int64_t B = q.size(0), nq = q.size(1), T = q.size(2), D = q.size(3), nkv = K_rows.size(1), R = nq / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (kernels) {  // generation: the fused CPU kernel when it applies
    auto o = cpu_attention(q, K_rows, V_rows, mask, scale, pk, pv);
    if (o.defined()) return o;
  }
  // ATen: a shared prefix is put in front of every row's keys.
  const auto K = pk.defined() ? at::cat({pk.expand({B, -1, -1, -1}), K_rows}, 2) : K_rows;
  const auto Vv = pv.defined() ? at::cat({pv.expand({B, -1, -1, -1}), V_rows}, 2) : V_rows;
  const int64_t S = K.size(2);
#if TORCH_VERSION_MAJOR >= 2
  // CUDA, several query positions (prefill, teacher forcing, training): one fused kernel
  // (scaled_dot_product_attention: memory-efficient attention with the additive mask; float32
  // softmax inside), as transformers' default "sdpa" attention runs. The scores never materialise:
  // on an H200 a 3,000-token prefill of a Qwen3-4B shape took 3.2x transformers' time with the
  // matmul-softmax-matmul path below (scripts/gpu-check.sh --bench 4b, 2026-11-26). K/V are
  // repeated to the query heads (a copy; enable_gqa is 2.5+ and not every kernel takes it). The mask
  // is the compute dtype's lowest value where masked (float32's lowest is -inf in bfloat16, which
  // would turn a fully padded query row into NaN instead of HF's uniform row). Decode steps (T = 1)
  // keep the path below: the copy of every cached K/V would cost more than it saves.
  if (q.is_cuda() && T > 1) {
    const auto dt = q.scalar_type();
    const double lo = dt == at::kBFloat16 ? -3.3895313892515355e38
                      : dt == at::kHalf   ? -65504.0
                                          : (double)std::numeric_limits<float>::lowest();
    const auto m = mask.clamp_min(lo).to(dt);  // [B, 1, T, S], broadcast over heads
    const auto Kx = R == 1 ? K : K.unsqueeze(2).expand({B, nkv, R, S, D}).reshape({B, nq, S, D});
    const auto Vx = R == 1 ? Vv : Vv.unsqueeze(2).expand({B, nkv, R, S, D}).reshape({B, nq, S, D});
    return at::scaled_dot_product_attention(q, Kx, Vx, m, 0.0, false);
  }
#endif
  // Grouped-query attention without repeating K/V: query head h uses kv head h / R, so the R query
  // heads of one kv head are stacked along the time axis: [B, nq, T, D] -> [B, nkv, R*T, D].
  auto qg = q.view({B, nkv, R * T, D});
  auto Kt = K.transpose(-1, -2);  // [B, nkv, D, S]
  // Chunk the queries so that the float32 score block stays under ~256 MB for long prefills.
  const int64_t per_query = B * nq * S * 4;
  int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(256) << 20) / std::max<int64_t>(per_query, 1)));
  // On the CPU (training, teacher forcing, a prefill with the kernels off) the queries go in blocks
  // of kCausalBlock, each against the keys up to the last one its rows may see: under the causal mask
  // the blocks skip the keys after them: of QKᵀ, the softmax and PV and of their backward, 37.5 % at
  // 512 tokens, towards half for longer ones
  // (attention's GEMMs took ~9 % of a 512-token LoRA step unblocked). The keys left out are masked
  // for every row of the block, so their probabilities are exactly 0; a block with a row that sees no
  // key keeps every key (its softmax is then uniform over all of them, as unblocked).
  std::vector<int64_t> ends;  // per block: how many keys it reads
  if (q.is_cpu() && mask.is_cpu() && T > 1) {
    chunk = std::min(chunk, kCausalBlock);
    ends = causal_key_ends(mask, chunk, T, S);
  }
  std::vector<at::Tensor> outs;
  for (int64_t t0 = 0, i = 0; t0 < T; t0 += chunk, ++i) {
    const int64_t c = std::min(chunk, T - t0), s = ends.empty() ? S : ends[i];
    auto qc = chunk == T ? qg : q.narrow(2, t0, c).reshape({B, nkv, R * c, D});
    auto scores = at::matmul(qc, s == S ? Kt : Kt.narrow(-1, 0, s)) * scale;                                       // [B, nkv, R*c, s]
    auto sf = scores.to(at::kFloat).view({B, nkv, R, c, s}) + mask.narrow(2, t0, c).narrow(3, 0, s).unsqueeze(1);  // [B,1,1,c,s]
    auto probs = at::softmax(sf, -1).to(q.scalar_type()).view({B, nkv, R * c, s});
    outs.push_back(at::matmul(probs, s == S ? Vv : Vv.narrow(2, 0, s)).view({B, nq, c, D}));  // [B, nq, c, D]
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 2);
}

}  // namespace slm
