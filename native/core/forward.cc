#include "core/forward.h"

#include <algorithm>
#include <string>

#include "core/errors.h"
#include "core/losses.h"

namespace slm {

namespace {
// A batch of sequences right-padded to the longest (real tokens never attend to the pads after them
// under the causal mask), on the model's device: ids, key mask, positions 0..T-1.
struct RightPadded {
  at::Tensor ids, mask, positions;
  int64_t T = 0;
};

RightPadded right_padded(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  RightPadded r;
  for (const auto& s : seqs) r.T = std::max<int64_t>(r.T, static_cast<int64_t>(s.size()));
  const auto li = at::TensorOptions().dtype(at::kLong);
  auto ids = at::zeros({B, r.T}, li), mask = at::zeros({B, r.T}, li);
  auto ia = ids.accessor<int64_t, 2>();
  auto ma = mask.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (size_t t = 0; t < seqs[b].size(); ++t) {
      ia[b][t] = seqs[b][t];
      ma[b][t] = 1;
    }
  const auto dev = model.device();
  r.ids = ids.to(dev);
  r.mask = mask.to(dev);
  r.positions = at::arange(r.T, li).unsqueeze(0).expand({B, r.T}).contiguous().to(dev);
  return r;
}
}  // namespace

std::vector<std::vector<float>> last_hidden(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  std::vector<std::vector<float>> out(B);
  for (const auto& s : seqs)
    if (s.empty()) fail("ARGUMENT_INVALID", "every sequence to embed needs at least one token; found an empty one.");
  if (B == 0) return out;
  auto p = right_padded(model, seqs);
  model.check_ids(p.ids);
  std::vector<int64_t> last_v(B);
  for (int64_t b = 0; b < B; ++b) last_v[b] = static_cast<int64_t>(seqs[b].size()) - 1;
  auto h = model.hidden(p.ids, p.positions, p.mask, nullptr);  // [B, T, hidden]
  auto idx = at::tensor(last_v, at::TensorOptions().dtype(at::kLong)).to(model.device()).view({B, 1, 1}).expand({B, 1, h.size(2)});
  auto v = h.gather(1, idx).squeeze(1).to(at::kFloat).to(at::kCPU).contiguous();  // [B, hidden]
  const int64_t H = v.size(1);
  const float* d = v.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) out[b].assign(d + b * H, d + (b + 1) * H);
  return out;
}

std::vector<std::vector<float>> sequence_values(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  std::vector<std::vector<float>> out(B);
  if (!model.value_head.defined())
    fail("NOT_SUPPORTED", "values: no value head is attached; call attachValueHead() or load an adapter saved with one.");
  auto p = right_padded(model, seqs);
  if (B == 0 || p.T == 0) return out;
  auto h = model.hidden(p.ids, p.positions, p.mask, nullptr,
                        ForwardOptions{true, false, false, false, false, model.has_critic()});  // the critic's adapter
  auto v = model.value_head.forward(h).to(at::kCPU).contiguous();                               // [B, T]
  auto va = v.accessor<float, 2>();
  for (int64_t b = 0; b < B; ++b) {
    out[b].resize(seqs[b].size());
    for (size_t t = 0; t < seqs[b].size(); ++t) out[b][t] = t == 0 ? 0.f : va[b][t - 1];
  }
  return out;
}

std::vector<std::vector<float>> sequence_logprobs(const Qwen3Model& model, const std::vector<std::vector<int32_t>>& seqs,
                                                  const std::vector<float>& temperature, bool reference,
                                                  const std::vector<std::vector<uint8_t>>& masks) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  std::vector<std::vector<float>> out(B);
  if (B == 0) return out;
  const int64_t nt = static_cast<int64_t>(temperature.size());
  if (nt != 1 && nt != B)
    fail("ARGUMENT_INVALID", "temperature for log-probs must hold one value or one per sequence (" + std::to_string(B) + "), found " +
                                 std::to_string(nt) + ".");
  for (int64_t i = 0; i < nt; ++i)
    if (!(temperature[i] > 0))
      fail("ARGUMENT_INVALID", "temperature for log-probs must be > 0, found " + std::to_string(temperature[i]) +
                                   (nt > 1 ? " at row " + std::to_string(i) : "") + ".");
  if (!masks.empty() && static_cast<int64_t>(masks.size()) != B)
    fail("ARGUMENT_INVALID",
         "log-prob masks must hold one row per sequence (" + std::to_string(B) + "), found " + std::to_string(masks.size()) + ".");
  auto p = right_padded(model, seqs);
  const int64_t T = p.T;
  if (T < 2) {
    for (int64_t b = 0; b < B; ++b) out[b].assign(seqs[b].size(), 0.f);
    return out;
  }
  // The positions scored: every token after the first of each row, or those its mask keeps; the
  // others (padding, a prompt when masked) never reach the vocabulary head.
  auto keep = at::zeros({B, T - 1}, at::kFloat);
  auto ka = keep.accessor<float, 2>();
  for (int64_t b = 0; b < B; ++b) {
    if (!masks.empty() && masks[b].size() != seqs[b].size())
      fail("ARGUMENT_INVALID", "log-prob mask " + std::to_string(b) + " must have one entry per token (" + std::to_string(seqs[b].size()) +
                                   "), found " + std::to_string(masks[b].size()) + ".");
    for (size_t t = 1; t < seqs[b].size(); ++t) ka[b][t - 1] = masks.empty() || masks[b][t] ? 1.f : 0.f;
  }
  auto temp = at::tensor(temperature, at::TensorOptions().dtype(at::kFloat)).expand({B}).contiguous();  // each row's own temperature
  const HeadRows rows(keep, p.ids.to(at::kCPU), temp, model.device());
  auto h = rows.hidden(model.hidden(p.ids, p.positions, p.mask, nullptr, ForwardOptions{true, false, false, reference}));  // [1, n, hidden]
  auto lp = at::zeros({1, rows.n}, at::TensorOptions().dtype(at::kFloat).device(model.device()));
  const int64_t chunk = head_chunk_rows(model.config().vocab_size);  // ~256 MB of float32 logits at a time
  HeadBuffers bufs;  // the same fused head as training (core/losses.h), its logits buffer reused
  for (int64_t c0 = 0; c0 < rows.n; c0 += chunk) {
    const int64_t c = std::min(chunk, rows.n - c0);
    lp.narrow(1, c0, c).copy_(
        head_token_stats(h.narrow(1, c0, c), model.head_weight(), rows.temp.narrow(1, c0, c), rows.targets.narrow(1, c0, c), bufs).lp);
  }
  auto rc = rows.scatter(lp).to(at::kCPU).contiguous();  // [B, T - 1]
  auto ra = rc.accessor<float, 2>();
  for (int64_t b = 0; b < B; ++b) {
    out[b].resize(seqs[b].size());
    for (size_t t = 0; t < seqs[b].size(); ++t) out[b][t] = t == 0 ? 0.f : ra[b][t - 1];
  }
  return out;
}

at::Tensor full_logits(const Qwen3Model& model, const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& positions) {
  const auto dev = model.device();
  auto h = model.hidden(ids.to(dev), positions.to(dev), mask.to(dev), nullptr);
  return model.logits(h).to(at::kCPU).contiguous();
}

}  // namespace slm
