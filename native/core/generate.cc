#include "core/generate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <unordered_set>

#include "core/errors.h"
#include "core/losses.h"
#include "core/sampler.h"

namespace slm {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Does `tail` (the row's recent output bytes) contain `stop` within the bytes that the last token
// added? A stop string may end inside a token (e.g. a token "</python>\n"), so we look at the last
// (len(stop) + len(token) - 1) bytes rather than only at the end.
bool ends_with_stop(const std::string& tail, size_t added, const std::string& stop) {
  if (stop.empty() || added == 0) return false;
  const size_t window = std::min(tail.size(), stop.size() + added - 1);
  return tail.find(stop, tail.size() - window) != std::string::npos;
}
}  // namespace

StopRule::StopRule(const std::vector<int32_t>& ids, const std::vector<std::string>& strings, const Vocab* vocab)
    : ids_(ids.begin(), ids.end()), strings_(strings), vocab_(vocab) {
  if (!strings_.empty() && (!vocab_ || vocab_->bytes.empty()))
    fail("ARGUMENT_INVALID", "stop strings need the vocabulary's byte strings: call setVocab on the model first.");
  for (const auto& s : strings_) longest_ = std::max(longest_, s.size());
}

uint8_t StopRule::check(int32_t t, std::string& tail) const {
  if (ids_.count(t)) return static_cast<uint8_t>(Finish::StopToken);
  if (longest_ == 0) return StepEvent::kRunning;
  const std::string& piece = (t >= 0 && static_cast<size_t>(t) < vocab_->bytes.size()) ? vocab_->bytes[t] : std::string();
  tail += piece;
  uint8_t f = StepEvent::kRunning;
  for (const auto& ss : strings_)
    if (ends_with_stop(tail, piece.size(), ss)) {
      f = static_cast<uint8_t>(Finish::StopString);
      break;
    }
  if (tail.size() > 4 * longest_ + 64) tail.erase(0, tail.size() - 2 * longest_ - 64);
  return f;
}

GenerateOutput generate(const Qwen3Model& model, const GenerateParams& p, const Vocab* vocab) {
  const int64_t B = static_cast<int64_t>(p.prompts.size());
  GenerateOutput out;
  out.tokens.resize(B);
  out.logprobs.resize(B);
  const int64_t top_n = std::max<int64_t>(0, p.top_n);
  if (top_n > 0) {
    out.top_ids.resize(B);
    out.top_logprobs.resize(B);
  }
  out.finish.assign(B, Finish::Length);
  if (B == 0 || p.max_new_tokens <= 0) return out;
  if (!p.row_max_new_tokens.empty() && static_cast<int64_t>(p.row_max_new_tokens.size()) != B)
    fail("ARGUMENT_INVALID", "generate: rowMaxNewTokens has " + std::to_string(p.row_max_new_tokens.size()) + " values for " +
                                 std::to_string(B) + " rows; give one per row or none.");
  std::vector<int64_t> row_max(B, p.max_new_tokens);
  for (int64_t b = 0; b < static_cast<int64_t>(p.row_max_new_tokens.size()); ++b) {
    if (p.row_max_new_tokens[b] < 1 || p.row_max_new_tokens[b] > p.max_new_tokens)
      fail("ARGUMENT_INVALID", "generate: rowMaxNewTokens[" + std::to_string(b) + "] must be from 1 to maxNewTokens (" +
                                   std::to_string(p.max_new_tokens) + "), found " + std::to_string(p.row_max_new_tokens[b]) + ".");
    row_max[b] = p.row_max_new_tokens[b];
  }
  if (static_cast<int64_t>(p.temperature.size()) != B)
    fail("ARGUMENT_INVALID",
         "expected one temperature per prompt (" + std::to_string(B) + "), found " + std::to_string(p.temperature.size()) + ".");
  const StopRule stops(p.stop_token_ids, p.stop_strings, vocab);
  int64_t L = 0;
  for (const auto& pr : p.prompts) {
    if (pr.empty()) fail("ARGUMENT_INVALID", "every prompt needs at least one token; found an empty prompt.");
    L = std::max<int64_t>(L, static_cast<int64_t>(pr.size()));
    out.prefill_tokens_requested += static_cast<int64_t>(pr.size());
  }
  std::vector<std::string> tails(B);

  if (!p.row_seeds.empty() && static_cast<int64_t>(p.row_seeds.size()) != B)
    fail("ARGUMENT_INVALID", "generate: rowSeeds has " + std::to_string(p.row_seeds.size()) + " seeds for " + std::to_string(B) +
                                 " rows; give one per row or none.");
  RowRng rng = p.row_seeds.empty() ? RowRng(p.seed, B) : RowRng(p.row_seeds);
  std::vector<int64_t> rows(B);  // original row of each batch slot
  for (int64_t b = 0; b < B; ++b) rows[b] = b;
  std::vector<float> temps = p.temperature;  // of the rows in the batch, in batch order
  std::vector<float> tops = p.row_top_p.empty() ? std::vector<float>(temps.size(), static_cast<float>(p.top_p)) : p.row_top_p;
  if (tops.size() != temps.size()) fail("ARGUMENT_INVALID", "row_top_p must have one value per prompt.");
  std::vector<bool> done(B, false);

  // Episode caches (p.episode_cache): each keyed row takes its entry out of the store and reuses the
  // longest prefix it shares with the prompt (past[b] tokens; at least one prompt token is left to
  // compute). C: the longest reused past. A stale entry (other weights) is dropped by the store.
  const bool keyed = p.episode_cache != nullptr && !p.cache_keys.empty();
  WeightsFingerprint weights;
  std::vector<int64_t> past(B, 0);
  std::vector<EpisodeCacheEntry> reused(B);
  int64_t C = 0;
  if (keyed) {
    if (static_cast<int64_t>(p.cache_keys.size()) != B)
      fail("ARGUMENT_INVALID", "generate: cacheKeys has " + std::to_string(p.cache_keys.size()) + " keys for " + std::to_string(B) +
                                   " rows; give one per row (an empty key: none) or none.");
    std::unordered_set<std::string> keys_seen;
    for (const auto& k : p.cache_keys)
      if (!k.empty() && !keys_seen.insert(k).second)
        fail("ARGUMENT_INVALID", "generate: cacheKeys must be distinct within a call; '" + k + "' is given to two rows.");
    weights = weights_fingerprint(model);
    for (int64_t b = 0; b < B; ++b) {
      if (p.cache_keys[b].empty()) continue;
      bool stale = false;
      auto e = p.episode_cache->take(p.cache_keys[b], weights, &stale);
      if (stale) ++out.cache_stale;
      if (!e) continue;
      const auto& pr = p.prompts[b];
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(e->tokens.size()), static_cast<int64_t>(pr.size()) - 1);
      int64_t i = 0;
      while (i < n && e->tokens[i] == pr[i]) ++i;
      if (i == 0) continue;
      past[b] = i;
      reused[b] = std::move(*e);
      C = std::max(C, i);
    }
  }
  const auto dev = model.device();
  const auto li = at::TensorOptions().dtype(at::kLong);
  KVCache cache;
  at::Tensor mask, h, logits, last_pos;
  double t0 = 0;
  if (C == 0) {
    // Shared prefixes (p.share_prefix): the distinct prompts are prefilled once each (uniq[u]: the
    // first row holding prompt u; of[b]: the distinct prompt of row b), and the P tokens common to all
    // of them once at batch 1 before that. P leaves every prompt at least one token of its own, whose
    // hidden state gives the first logits. Without sharing: U = B, of = identity, P = 0.
    std::vector<int64_t> uniq, of(B);
    if (p.share_prefix) {
      std::map<std::vector<int32_t>, int64_t> seen;
      for (int64_t b = 0; b < B; ++b) {
        auto ins = seen.emplace(p.prompts[b], static_cast<int64_t>(uniq.size()));
        if (ins.second) uniq.push_back(b);
        of[b] = ins.first->second;
      }
    } else {
      for (int64_t b = 0; b < B; ++b) {
        uniq.push_back(b);
        of[b] = b;
      }
    }
    const int64_t U = static_cast<int64_t>(uniq.size());
    int64_t P = 0;
    if (p.share_prefix && U > 1) {
      const auto& first = p.prompts[uniq[0]];
      P = static_cast<int64_t>(first.size()) - 1;
      for (int64_t u = 1; u < U && P > 0; ++u) {
        const auto& pr = p.prompts[uniq[u]];
        const int64_t n = std::min<int64_t>(P, static_cast<int64_t>(pr.size()) - 1);
        int64_t i = 0;
        while (i < n && pr[i] == first[i]) ++i;
        P = i;
      }
    }
    // Per distinct prompt, [U, L]: the shared prefix at [0, P), then padding, then the rest of the
    // prompt right-aligned at the end (P = 0: plain left padding). mask 1 = real; positions =
    // cumsum(mask) - 1, so every real token keeps its position in its prompt (pads -> 1, as HF).
    auto ids = at::full({U, L}, p.pad_id, li);
    mask = at::zeros({U, L}, li);
    auto ids_a = ids.accessor<int64_t, 2>();
    auto mask_a = mask.accessor<int64_t, 2>();
    for (int64_t u = 0; u < U; ++u) {
      const auto& pr = p.prompts[uniq[u]];
      const int64_t n = static_cast<int64_t>(pr.size());
      out.prefill_tokens += n - P;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t at_ = t < P ? t : L - n + t;
        ids_a[u][at_] = pr[t];
        mask_a[u][at_] = 1;
      }
    }
    out.prefill_tokens += P;
    auto positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1);
    ids = ids.to(dev);
    mask = mask.to(dev);
    positions = positions.to(dev);
    model.check_ids(ids);

    cache = model.new_cache(P > 0 ? 1 : U, L + p.max_new_tokens);
    t0 = now();
    // Columns [s0, s1) of (ids, positions) through the model into `cache`, p.prefill_chunk at a time
    // (each chunk's keys: the key mask's columns [0, end)); the last chunk's hidden states. false: every
    // row was cancelled between two chunks (nothing more computed).
    const auto all_cancelled = [&] {
      if (!p.cancel) return false;
      for (int64_t b = 0; b < B; ++b)
        if (!p.cancel[b].load(std::memory_order_relaxed)) return false;
      return true;
    };
    int64_t cols_done = 0;  // key-mask columns whose tokens are in the cache
    const auto prefill = [&](const at::Tensor& ids_, const at::Tensor& pos_, const at::Tensor& keys_, int64_t s0, int64_t s1,
                             at::Tensor* last) {
      const int64_t step = p.prefill_chunk > 0 ? p.prefill_chunk : s1 - s0;
      for (int64_t s = s0; s < s1; s += step) {
        if (s > s0 && all_cancelled()) return false;
        const int64_t e = std::min(s1, s + step);
        auto hc = model.hidden(ids_.narrow(1, s, e - s).contiguous(), pos_.narrow(1, s, e - s).contiguous(),
                               keys_.narrow(1, 0, e).contiguous(), &cache);
        cols_done = e;
        if (e == s1 && last) *last = hc;
      }
      return true;
    };
    // Stopped between chunks: every row cancelled, prefill_tokens = the prompt tokens actually run.
    const auto cancelled_out = [&](bool in_prefix) {
      for (int64_t b = 0; b < B; ++b) out.finish[b] = Finish::Cancelled;
      const auto real = [](const at::Tensor& m) { return m.numel() ? m.sum().item<int64_t>() : int64_t(0); };
      out.prefill_tokens = in_prefix ? real(mask.narrow(0, 0, 1).narrow(1, 0, cols_done)) : P + real(mask.narrow(1, P, cols_done - P));
      out.prefill_seconds = now() - t0;
      return out;
    };
    if (P > 0) {  // the common prefix once, then shared by every distinct prompt's rows (read from one place)
      if (!prefill(ids.narrow(0, 0, 1), positions.narrow(0, 0, 1), mask.narrow(0, 0, 1), 0, P, nullptr)) return cancelled_out(true);
      cache.share_prefix(U);
    }
    if (!prefill(ids, positions, mask, P, L, &h)) return cancelled_out(false);  // h: the last chunk, [U, c, hidden]
    logits = model.logits(h.narrow(1, h.size(1) - 1, 1), true).squeeze(1);      // [U, V]
    last_pos = positions.narrow(1, L - 1, 1).squeeze(1);                        // [U]
    if (U < B) {  // every row of a repeated prompt gets a copy of its cache rows and logits
      auto of_t = at::tensor(of, li).to(dev);
      cache.keep_rows(of_t);
      logits = logits.index_select(0, of_t);
      last_pos = last_pos.index_select(0, of_t);
      mask = mask.index_select(0, of_t);
    }
  } else {
    // Rows continuing an episode: [B, C + R] keys, each row's reused past right-aligned in [0, C)
    // (copied from its entry), the rest of its prompt right-aligned in [C, C + R) and prefilled;
    // positions = cumsum(mask) - 1 as in the shared path, so every token keeps its position.
    // With sharing on and every row continuing an episode, the tokens that begin every row's past
    // (a system prompt, a question's K samples) are put once in the cache as a prefix all rows read
    // (taken from the first row's entry: the same tokens at the same positions), at [0, P); each
    // row's past beyond it is right-aligned in [P, C).
    int64_t P = 0;
    if (p.share_prefix && B > 1 && std::all_of(past.begin(), past.end(), [](int64_t c) { return c > 0; })) {
      P = *std::min_element(past.begin(), past.end());
      for (int64_t b = 1; b < B && P > 0; ++b) {
        int64_t i = 0;
        while (i < P && reused[b].tokens[i] == reused[0].tokens[i]) ++i;
        P = i;
      }
    }
    int64_t R = 0;
    for (int64_t b = 0; b < B; ++b) R = std::max<int64_t>(R, static_cast<int64_t>(p.prompts[b].size()) - past[b]);
    auto ids = at::full({B, R}, p.pad_id, li);
    mask = at::zeros({B, C + R}, li);
    auto ids_a = ids.accessor<int64_t, 2>();
    auto mask_a = mask.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const auto& pr = p.prompts[b];
      const int64_t c = past[b], r = static_cast<int64_t>(pr.size()) - c;
      for (int64_t t = 0; t < c; ++t) mask_a[b][t < P ? t : C - c + t] = 1;
      for (int64_t t = 0; t < r; ++t) {
        ids_a[b][R - r + t] = pr[c + t];
        mask_a[b][C + R - r + t] = 1;
      }
      out.prefill_tokens += r;
      out.cache_reused_tokens += c;
      if (c > 0) ++out.cache_hits;
    }
    auto positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1).narrow(1, C, R).contiguous().to(dev);
    ids = ids.to(dev);
    mask = mask.to(dev);
    model.check_ids(ids);
    t0 = now();
    if (P > 0) {
      cache = model.new_cache(1, C + R + p.max_new_tokens);
      for (size_t l = 0; l < cache.k.size(); ++l) {
        cache.k[l][0].narrow(1, 0, P).copy_(reused[0].k[l].narrow(1, 0, P));
        cache.v[l][0].narrow(1, 0, P).copy_(reused[0].v[l].narrow(1, 0, P));
      }
      cache.length = P;
      cache.share_prefix(B);
    } else {
      cache = model.new_cache(B, C + R + p.max_new_tokens);
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t c = past[b];
      if (c == 0) continue;
      for (size_t l = 0; l < cache.k.size(); ++l) {
        cache.k[l][b].narrow(1, C - c, c - P).copy_(reused[b].k[l].narrow(1, P, c - P));
        cache.v[l][b].narrow(1, C - c, c - P).copy_(reused[b].v[l].narrow(1, P, c - P));
      }
      reused[b] = EpisodeCacheEntry();
    }
    cache.length = C;
    h = model.hidden(ids, positions, mask, &cache);                 // [B, R, hidden]
    logits = model.logits(h.narrow(1, R - 1, 1), true).squeeze(1);  // [B, V]
    last_pos = positions.narrow(1, R - 1, 1).squeeze(1);            // [B]
  }
  out.prefill_seconds = now() - t0;

  // A keyed row's KV goes back to the store when it leaves the batch (compaction) or at the end:
  // its real positions (mask 1: prompt and every generated token fed back so far), in order.
  auto save = [&](int64_t slot) {
    const int64_t r = rows[slot];
    if (!keyed || p.cache_keys[r].empty()) return;
    auto idx = at::nonzero(mask[slot]).squeeze(1);
    const int64_t n = idx.size(0);
    std::vector<int32_t> toks = p.prompts[r];
    toks.insert(toks.end(), out.tokens[r].begin(), out.tokens[r].end());
    if (n == 0 || n > static_cast<int64_t>(toks.size())) return;
    toks.resize(n);
    EpisodeCacheEntry e;
    e.tokens = std::move(toks);
    e.weights = weights;
    std::tie(e.k, e.v) = cache.row_past(slot, idx);
    out.cache_evicted += p.episode_cache->put(p.cache_keys[r], std::move(e));
  };
  t0 = now();

  at::Tensor logits_buf;  // every decode step's logits, on the CPU (see Qwen3Model::logits)
  for (int64_t step = 0; step < p.max_new_tokens; ++step) {
    auto u = at::tensor(rng.next(rows), at::TensorOptions().dtype(at::kFloat)).to(dev);
    auto s = sample(logits, temps, p.top_k, tops, u, top_n);
    auto tok_cpu = s.tokens.to(at::kCPU);
    auto lp_cpu = s.logprobs.to(at::kCPU);
    auto tok_a = tok_cpu.accessor<int64_t, 1>();
    auto lp_a = lp_cpu.accessor<float, 1>();
    at::Tensor top_ids_cpu, top_lp_cpu;
    if (top_n > 0) {
      top_ids_cpu = s.top_ids.to(at::kCPU).to(at::kInt).contiguous();
      top_lp_cpu = s.top_logprobs.to(at::kCPU).contiguous();
    }
    const int64_t n_top = top_n > 0 ? top_ids_cpu.size(1) : 0;
    const int64_t Bc = static_cast<int64_t>(rows.size());
    int64_t finished_in_batch = 0;
    std::vector<int64_t> alive_mask(Bc, 1);
    StepEvent ev;
    for (int64_t i = 0; i < Bc; ++i) {
      const int64_t r = rows[i];
      if (!done[r] && p.cancel && p.cancel[r].load(std::memory_order_relaxed)) {
        done[r] = true;
        out.finish[r] = Finish::Cancelled;
      }
      if (done[r]) {
        alive_mask[i] = 0;
        ++finished_in_batch;
        continue;
      }
      const int32_t t = static_cast<int32_t>(tok_a[i]);
      out.tokens[r].push_back(t);
      out.logprobs[r].push_back(lp_a[i]);
      if (top_n > 0) {
        const int32_t* ti = top_ids_cpu.data_ptr<int32_t>() + i * n_top;
        const float* tl = top_lp_cpu.data_ptr<float>() + i * n_top;
        out.top_ids[r].insert(out.top_ids[r].end(), ti, ti + n_top);
        out.top_logprobs[r].insert(out.top_logprobs[r].end(), tl, tl + n_top);
        if (p.on_step) {
          ev.top_ids.insert(ev.top_ids.end(), ti, ti + n_top);
          ev.top_logprobs.insert(ev.top_logprobs.end(), tl, tl + n_top);
        }
      }
      const uint8_t f = stops.check(t, tails[r]);
      if (f != StepEvent::kRunning) {
        done[r] = true;
        out.finish[r] = static_cast<Finish>(f);
      }
      if (!done[r] && static_cast<int64_t>(out.tokens[r].size()) >= row_max[r]) {
        done[r] = true;
        out.finish[r] = Finish::Length;
      }
      if (p.on_step) {
        ev.rows.push_back(static_cast<int32_t>(r));
        ev.tokens.push_back(t);
        ev.logprobs.push_back(lp_a[i]);
        ev.finish.push_back(done[r] ? static_cast<uint8_t>(out.finish[r]) : StepEvent::kRunning);
      }
      if (done[r]) {
        alive_mask[i] = 0;
        ++finished_in_batch;
      }
    }
    if (p.on_step && !ev.rows.empty()) p.on_step(std::move(ev));
    out.steps = step + 1;
    if (finished_in_batch == Bc || step + 1 == p.max_new_tokens) {
      if (keyed)
        for (int64_t i = 0; i < Bc; ++i) save(i);
      break;
    }
    auto next = s.tokens.unsqueeze(1);  // [Bc, 1]
    auto alive = at::tensor(alive_mask, li).to(dev);
    if (finished_in_batch * 4 >= Bc) {  // a cancelled row counts as finished: masked until then
      // Compact: keep only the live rows (cost: one copy of the cache; at most log_{4/3}(B) times).
      std::vector<int64_t> keep, new_rows;
      for (int64_t i = 0; i < Bc; ++i)
        if (!alive_mask[i] && keyed) save(i);
      for (int64_t i = 0; i < Bc; ++i)
        if (alive_mask[i]) {
          keep.push_back(i);
          new_rows.push_back(rows[i]);
        }
      auto keep_t = at::tensor(keep, li).to(dev);
      cache.keep_rows(keep_t);
      mask = mask.index_select(0, keep_t);
      last_pos = last_pos.index_select(0, keep_t);
      std::vector<float> kept_temps, kept_tops;
      for (auto i : keep) kept_temps.push_back(temps[i]), kept_tops.push_back(tops[i]);
      temps = std::move(kept_temps);
      tops = std::move(kept_tops);
      next = next.index_select(0, keep_t);
      alive = at::ones({static_cast<int64_t>(keep.size())}, li.device(dev));
      rows = std::move(new_rows);
    }
    mask = at::cat({mask, alive.unsqueeze(1)}, 1);
    last_pos = last_pos + 1;
    h = model.hidden(next, last_pos.unsqueeze(1), mask, &cache);
    if (!logits_buf.defined() && dev.is_cpu())
      logits_buf = at::empty({B, model.config().vocab_size}, at::TensorOptions().dtype(at::kFloat));
    logits = model.logits(h, true, logits_buf).squeeze(1);  // the sampler is done with the previous step's
  }
  out.decode_seconds = now() - t0;
  return out;
}

}  // namespace slm
