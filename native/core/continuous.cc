#include "core/continuous.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "core/errors.h"

namespace slm {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// Free columns a rebuilt cache gets beyond the rows' pasts (a rebuild copies the cache: this many
// decode steps run between two rebuilds when nothing joins or leaves).
constexpr int64_t kSlack = 128;
}  // namespace

ContinuousBatch::ContinuousBatch(const Qwen3Model& model, SessionParams p, const Vocab* vocab)
    : model_(model), p_(std::move(p)), stops_(p_.stop_token_ids, p_.stop_strings, vocab) {
  if (p_.max_rows < 1) fail("ARGUMENT_INVALID", "decodeSession: maxRows must be at least 1, found " + std::to_string(p_.max_rows) + ".");
  if (p_.prefill_chunk < 0)
    fail("ARGUMENT_INVALID",
         "decodeSession: prefillChunk must be 0 or a positive number of positions, found " + std::to_string(p_.prefill_chunk) + ".");
}

std::vector<int64_t> ContinuousBatch::submit(std::vector<RowRequest> rows) {
  std::vector<RowStream> rngs;
  for (const auto& r : rows) rngs.emplace_back(r.seed);
  std::vector<int64_t> ids;
  std::lock_guard<std::mutex> g(mu_);
  if (closed_) return ids;
  for (size_t i = 0; i < rows.size(); ++i) {
    ids.push_back(next_id_++);
    inbox_.push_back(Row{ids.back(), std::move(rows[i]), rngs[i]});
  }
  return ids;
}

void ContinuousBatch::cancel(int64_t row) {
  std::lock_guard<std::mutex> g(mu_);
  if (row >= 0 && row < next_id_ && !closed_) cancelled_.insert(row);
}

void ContinuousBatch::end_row(StepEvent& ev, const Row& r, int32_t token, float logprob, Finish f) {
  ev.rows.push_back(static_cast<int32_t>(r.id));
  ev.tokens.push_back(token);
  ev.logprobs.push_back(logprob);
  ev.finish.push_back(static_cast<uint8_t>(f));
  if (p_.top_n > 0 && token < 0) {  // no token: top entries of -1 / -inf keep the rows aligned
    ev.top_ids.insert(ev.top_ids.end(), p_.top_n, -1);
    ev.top_logprobs.insert(ev.top_logprobs.end(), p_.top_n, -std::numeric_limits<float>::infinity());
  }
}

// Under mu_: the inbox's first rows become the group to prefill, as many as the free rows allow,
// each while at least half of the group's padded positions stay real tokens.
void ContinuousBatch::take_inbox() {
  int64_t live = 0;
  for (auto a : alive_) live += a;
  const int64_t room = p_.max_rows - live;
  if (!group_.empty() || inbox_.empty() || room <= 0) return;
  std::vector<Row> rest;
  int64_t sum = 0, longest = 0;
  for (auto& r : inbox_) {
    const int64_t n = static_cast<int64_t>(r.req.prompt.size());
    const int64_t padded = std::max(longest, n) * static_cast<int64_t>(group_.size() + 1);
    if (static_cast<int64_t>(group_.size()) < room && (group_.empty() || padded <= 2 * (sum + n))) {
      sum += n;
      longest = std::max(longest, n);
      group_.push_back(std::move(r));
    } else {
      rest.push_back(std::move(r));
    }
  }
  inbox_ = std::move(rest);
  // Distinct prompts once each (a request's n choices share theirs), left-padded to the longest.
  std::map<std::vector<int32_t>, int64_t> seen;
  std::vector<int64_t> uniq;
  of_.clear();
  for (size_t g = 0; g < group_.size(); ++g) {
    auto ins = seen.emplace(group_[g].req.prompt, static_cast<int64_t>(uniq.size()));
    if (ins.second) uniq.push_back(static_cast<int64_t>(g));
    of_.push_back(ins.first->second);
  }
  const int64_t U = static_cast<int64_t>(uniq.size());
  const auto li = at::TensorOptions().dtype(at::kLong);
  auto ids = at::full({U, longest}, p_.pad_id, li);
  auto mask = at::zeros({U, longest}, li);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t u = 0; u < U; ++u) {
    const auto& pr = group_[uniq[u]].req.prompt;
    const int64_t n = static_cast<int64_t>(pr.size());
    for (int64_t t = 0; t < n; ++t) {
      ids_a[u][longest - n + t] = pr[t];
      mask_a[u][longest - n + t] = 1;
    }
  }
  const auto dev = model_.device();
  gpos_ = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1).to(dev);
  gids_ = ids.to(dev);
  gmask_ = mask.to(dev);
  gcache_ = model_.new_cache(U, longest);
  gdone_ = 0;
}

void ContinuousBatch::prefill_chunk() {
  const double t0 = now();
  const int64_t L = gids_.size(1);
  const int64_t e = std::min(L, gdone_ + (p_.prefill_chunk > 0 ? p_.prefill_chunk : L));
  auto h = model_.hidden(gids_.narrow(1, gdone_, e - gdone_).contiguous(), gpos_.narrow(1, gdone_, e - gdone_).contiguous(),
                         gmask_.narrow(1, 0, e).contiguous(), &gcache_);
  stats_.prefill_tokens += gmask_.narrow(1, gdone_, e - gdone_).sum().item<int64_t>();
  gdone_ = e;
  if (e == L) {
    glogits_ = model_.logits(h.narrow(1, h.size(1) - 1, 1), true).squeeze(1);  // [U, V]
    glast_pos_ = gpos_.narrow(1, L - 1, 1).squeeze(1);                         // [U]
  }
  stats_.prefill_seconds += now() - t0;
}

at::Tensor ContinuousBatch::rebuild(bool with_group, int64_t extra) {
  const auto dev = model_.device();
  const auto li = at::TensorOptions().dtype(at::kLong);
  std::vector<int64_t> keep;
  for (size_t i = 0; i < rows_.size(); ++i)
    if (alive_[i]) keep.push_back(static_cast<int64_t>(i));
  auto keep_t = at::tensor(keep, li).to(dev);
  const int64_t nb = static_cast<int64_t>(keep.size()), ng = with_group ? gids_.size(0) : 0;
  // The batch's window: from the first column a kept row uses to its last.
  int64_t wb = 0;
  at::Tensor kmask;
  if (nb > 0) {
    kmask = mask_.index_select(0, keep_t);
    auto used = kmask.amax(0).to(at::kCPU);
    auto used_a = used.accessor<int64_t, 1>();
    int64_t c0 = 0;
    while (c0 < used.size(0) && used_a[c0] == 0) ++c0;
    wb = cache_.length - c0;
    kmask = kmask.narrow(1, c0, wb);
  }
  const int64_t wg = ng > 0 ? gcache_.length : 0, W = std::max(wb, wg), B = nb + ng;
  KVCache c = model_.new_cache(B, W + extra);
  auto mask = at::zeros({B, W}, li.device(dev));
  for (size_t l = 0; l < c.k.size(); ++l) {
    if (nb > 0) {
      c.k[l].narrow(0, 0, nb).narrow(2, W - wb, wb).copy_(cache_.k[l].index_select(0, keep_t).narrow(2, cache_.length - wb, wb));
      c.v[l].narrow(0, 0, nb).narrow(2, W - wb, wb).copy_(cache_.v[l].index_select(0, keep_t).narrow(2, cache_.length - wb, wb));
    }
    if (ng > 0) {
      c.k[l].narrow(0, nb, ng).narrow(2, W - wg, wg).copy_(gcache_.k[l].narrow(2, 0, wg));
      c.v[l].narrow(0, nb, ng).narrow(2, W - wg, wg).copy_(gcache_.v[l].narrow(2, 0, wg));
    }
  }
  if (nb > 0) mask.narrow(0, 0, nb).narrow(1, W - wb, wb).copy_(kmask);
  if (ng > 0) mask.narrow(0, nb, ng).narrow(1, W - wg, wg).copy_(gmask_);
  c.length = W;
  cache_ = std::move(c);
  mask_ = mask;
  std::vector<at::Tensor> pos;
  if (nb > 0) pos.push_back(last_pos_.index_select(0, keep_t));
  if (ng > 0) pos.push_back(glast_pos_);
  last_pos_ = at::cat(pos);
  std::vector<Row> rows;
  for (auto i : keep) rows.push_back(std::move(rows_[i]));
  if (ng > 0)
    for (auto& r : group_) rows.push_back(std::move(r));
  rows_ = std::move(rows);
  alive_.assign(rows_.size(), 1);
  ++stats_.rebuilds;
  return keep_t;
}

void ContinuousBatch::join_group() {
  const auto dev = model_.device();
  const auto li = at::TensorOptions().dtype(at::kLong);
  if (static_cast<int64_t>(group_.size()) > gids_.size(0)) {  // every row of a repeated prompt gets a copy
    auto of_t = at::tensor(of_, li).to(dev);
    gcache_.keep_rows(of_t);
    gmask_ = gmask_.index_select(0, of_t);
    glogits_ = glogits_.index_select(0, of_t);
    glast_pos_ = glast_pos_.index_select(0, of_t);
    gids_ = gids_.index_select(0, of_t);
  }
  int64_t live = 0;
  for (auto a : alive_) live += a;
  if (live > 0) stats_.joined += static_cast<int64_t>(group_.size());
  const auto keep_t = rebuild(true, kSlack);  // logits_ still holds the old rows' pending logits
  logits_ = live > 0 ? at::cat({logits_.index_select(0, keep_t), glogits_}) : glogits_;
  group_.clear();
  gcache_ = KVCache();
  gids_ = gpos_ = gmask_ = glogits_ = glast_pos_ = at::Tensor();
}

void ContinuousBatch::decode_step(StepEvent& ev) {
  const double t0 = now();
  const auto dev = model_.device();
  const auto li = at::TensorOptions().dtype(at::kLong);
  const int64_t B = static_cast<int64_t>(rows_.size());
  std::vector<float> temps(B, 0.f), tops(B, 1.f), u(B, 1.f);
  for (int64_t i = 0; i < B; ++i) {
    if (alive_[i] && rows_[i].cancelled) {
      alive_[i] = 0;
      end_row(ev, rows_[i], -1, 0.f, Finish::Cancelled);
    }
    if (!alive_[i]) continue;
    temps[i] = rows_[i].req.temperature;
    tops[i] = rows_[i].req.top_p;
    u[i] = rows_[i].rng.next();
  }
  auto s = sample(logits_, temps, p_.top_k, tops, at::tensor(u, at::TensorOptions().dtype(at::kFloat)).to(dev), p_.top_n);
  auto tok = s.tokens.to(at::kCPU);
  auto lp = s.logprobs.to(at::kCPU);
  auto tok_a = tok.accessor<int64_t, 1>();
  auto lp_a = lp.accessor<float, 1>();
  at::Tensor top_ids, top_lps;
  if (p_.top_n > 0) {
    top_ids = s.top_ids.to(at::kCPU).to(at::kInt).contiguous();
    top_lps = s.top_logprobs.to(at::kCPU).contiguous();
  }
  const int64_t n_top = p_.top_n > 0 ? top_ids.size(1) : 0;
  int64_t live = 0;
  for (int64_t i = 0; i < B; ++i) {
    if (!alive_[i]) continue;
    auto& r = rows_[i];
    const int32_t t = static_cast<int32_t>(tok_a[i]);
    ++r.produced;
    uint8_t f = stops_.check(t, r.tail);
    if (f == StepEvent::kRunning && r.produced >= r.req.max_new_tokens) f = static_cast<uint8_t>(Finish::Length);
    ev.rows.push_back(static_cast<int32_t>(r.id));
    ev.tokens.push_back(t);
    ev.logprobs.push_back(lp_a[i]);
    ev.finish.push_back(f);
    if (n_top > 0) {
      ev.top_ids.insert(ev.top_ids.end(), top_ids.data_ptr<int32_t>() + i * n_top, top_ids.data_ptr<int32_t>() + (i + 1) * n_top);
      ev.top_logprobs.insert(ev.top_logprobs.end(), top_lps.data_ptr<float>() + i * n_top, top_lps.data_ptr<float>() + (i + 1) * n_top);
    }
    if (f != StepEvent::kRunning)
      alive_[i] = 0;
    else
      ++live;
  }
  ++stats_.steps;
  stats_.max_batch = std::max(stats_.max_batch, B);
  if (live == 0) {
    rows_.clear();
    alive_.clear();
    cache_ = KVCache();
    mask_ = last_pos_ = logits_ = at::Tensor();
    stats_.decode_seconds += now() - t0;
    return;
  }
  auto next = s.tokens.unsqueeze(1);  // [B, 1]
  if ((B - live) * 4 >= B || cache_.length + 1 > cache_.capacity) {
    // Compact (the finished rows leave, and the columns no live row uses), or grow the cache.
    next = next.index_select(0, rebuild(false, kSlack));
  }
  std::vector<int64_t> alive_col(alive_.begin(), alive_.end());
  mask_ = at::cat({mask_, at::tensor(alive_col, li).to(dev).unsqueeze(1)}, 1);
  last_pos_ = last_pos_ + 1;
  auto h = model_.hidden(next, last_pos_.unsqueeze(1), mask_, &cache_);
  if (!logits_buf_.defined() && dev.is_cpu())
    logits_buf_ = at::empty({p_.max_rows, model_.config().vocab_size}, at::TensorOptions().dtype(at::kFloat));
  logits_ = model_.logits(h, true, logits_buf_).squeeze(1);
  stats_.decode_seconds += now() - t0;
}

SessionStats ContinuousBatch::run() {
  try {
    while (true) {
      StepEvent ev;
      std::unordered_set<int64_t> cancel;
      bool done = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        cancel.swap(cancelled_);
        std::vector<Row> kept;
        for (auto& r : inbox_) {
          if (cancel.count(r.id))
            end_row(ev, r, -1, 0.f, Finish::Cancelled);
          else
            kept.push_back(std::move(r));
        }
        inbox_ = std::move(kept);
        for (auto& r : group_) r.cancelled = r.cancelled || cancel.count(r.id) > 0;
        for (auto& r : rows_) r.cancelled = r.cancelled || cancel.count(r.id) > 0;
        take_inbox();
        if (rows_.empty() && group_.empty() && inbox_.empty()) closed_ = done = true;
      }
      if (!group_.empty()) {
        // A group whose every row was cancelled stops here; otherwise its rows that were are ended
        // when it joins (their prefill is shared with the others').
        const bool all = std::all_of(group_.begin(), group_.end(), [](const Row& r) { return r.cancelled; });
        if (all) {
          for (auto& r : group_) end_row(ev, r, -1, 0.f, Finish::Cancelled);
          group_.clear();
          gcache_ = KVCache();
        } else {
          prefill_chunk();
          if (gdone_ == gids_.size(1)) {
            stats_.rows += static_cast<int64_t>(group_.size());
            join_group();
          }
        }
      }
      if (!rows_.empty()) decode_step(ev);
      if (p_.on_step && !ev.rows.empty()) p_.on_step(std::move(ev));
      if (done) return stats_;
    }
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    closed_ = true;
    throw;
  }
}

}  // namespace slm
