// Multi-turn KV-cache reuse (issue 19, item 2): a store of per-episode KV caches on a model handle,
// keyed by a caller's string (an episode). generate() takes a keyed row's entry out of the store,
// reuses the longest prefix its tokens share with the row's new prompt (only the rest is prefilled)
// and puts the row's KV back (prompt + generated tokens, real positions only) when the row is done.
//
// An entry is valid only for the weights it was computed with: it records the adapter tensors (held,
// so that their identity cannot be reused) and their version counters (bumped by every in-place
// update: optimizer steps, setTrainable); attaching, loading or detaching an adapter replaces the
// tensors. A stale entry is dropped and the row re-prefills. The base weights are frozen.
//
// Memory is bounded by a byte limit: putting an entry evicts the least recently used entries until
// the total fits (an entry larger than the limit is not kept). Evicted rows re-prefill next time.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/qwen3.h"

namespace slm {

// What the cached keys/values were computed with: every LoRA tensor (undefined where a projection
// has none) and its version counter, in a fixed order.
struct WeightsFingerprint {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> versions;
  std::vector<double> scales;
  bool same(const WeightsFingerprint& o) const;
};
WeightsFingerprint weights_fingerprint(const Qwen3Model& model);

struct EpisodeCacheEntry {
  std::vector<int32_t> tokens;   // the token of every cached position, in order
  std::vector<at::Tensor> k, v;  // per layer [n_kv, tokens.size(), head_dim], on the model's device
  WeightsFingerprint weights;
  int64_t bytes() const;
};

struct EpisodeCacheStats {
  int64_t entries = 0, tokens = 0, bytes = 0, limit_bytes = 0;
  int64_t evicted = 0;  // entries evicted by the limit since the store was made
  int64_t stale = 0;    // entries dropped because the weights changed
};

class EpisodeCacheStore {
 public:
  explicit EpisodeCacheStore(int64_t limit_bytes = kDefaultLimit) : limit_(limit_bytes) {}
  static constexpr int64_t kDefaultLimit = int64_t(2048) << 20;

  // Removes and returns the entry of `key` when it was computed with `weights` (a stale one is
  // dropped and counted, *stale set); nullopt when there is none.
  std::optional<EpisodeCacheEntry> take(const std::string& key, const WeightsFingerprint& weights, bool* stale = nullptr);
  // Stores (replacing any entry of the key), then evicts the least recently used entries until the
  // total fits the limit; returns how many entries were evicted (the new one included if too large).
  int64_t put(const std::string& key, EpisodeCacheEntry&& e);
  void release(const std::vector<std::string>& keys);
  void clear();
  void set_limit(int64_t bytes);
  EpisodeCacheStats stats() const;

 private:
  int64_t evict_locked();
  struct Slot {
    EpisodeCacheEntry entry;
    std::list<std::string>::iterator lru;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> map_;
  std::list<std::string> lru_;  // least recently used first
  int64_t limit_;
  int64_t bytes_ = 0, tokens_ = 0, evicted_ = 0, stale_ = 0;
};

}  // namespace slm
