// The KV cache's own operations (its layout is in core/qwen3.h): keeping rows, sharing a one-row
// prefix across a batch (the cascade cache), and one row's past for the attention kernels.
#include <ATen/ATen.h>

#include "core/errors.h"
#include "core/qwen3.h"

namespace slm {

void KVCache::keep_rows(const at::Tensor& rows) {
  for (auto& t : k) t = t.index_select(0, rows);
  for (auto& t : v) t = t.index_select(0, rows);
}

void KVCache::share_prefix(int64_t rows) {
  if (prefix != 0 || k.empty() || k[0].size(0) != 1)
    fail("NATIVE_ERROR", "share_prefix needs a one-row cache without a shared prefix (an engine bug: please report it).");
  prefix = length;
  pk.clear(), pv.clear();
  for (size_t l = 0; l < k.size(); ++l) {
    pk.push_back(k[l].narrow(2, 0, prefix));
    pv.push_back(v[l].narrow(2, 0, prefix));
    auto sizes = k[l].sizes().vec();
    sizes[0] = rows;
    sizes[2] = capacity - prefix;
    k[l] = at::zeros(sizes, k[l].options());
    v[l] = at::zeros(sizes, v[l].options());
  }
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> KVCache::row_past(int64_t row, const at::Tensor& idx) const {
  const int64_t n_pre = prefix ? (idx < prefix).sum().item<int64_t>() : 0;  // positions in the shared prefix
  const auto pre_idx = idx.narrow(0, 0, n_pre), own_idx = idx.narrow(0, n_pre, idx.size(0) - n_pre) - prefix;
  const auto pick = [&](const at::Tensor& shared, const at::Tensor& own) {
    auto o = own[row].index_select(1, own_idx);
    if (n_pre == 0) return o;
    return at::cat({n_pre == prefix ? shared[0] : shared[0].index_select(1, pre_idx), o}, 1);
  };
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> r;
  for (size_t l = 0; l < k.size(); ++l) {
    r.first.push_back(pick(prefix ? pk[l] : at::Tensor(), k[l]));
    r.second.push_back(pick(prefix ? pv[l] : at::Tensor(), v[l]));
  }
  return r;
}

}  // namespace slm
