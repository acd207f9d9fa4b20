#include "core/episode_cache.h"

#include <ATen/ATen.h>

namespace slm {

bool WeightsFingerprint::same(const WeightsFingerprint& o) const {
  if (tensors.size() != o.tensors.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() != o.tensors[i].defined()) return false;
    if (tensors[i].defined() && !tensors[i].is_same(o.tensors[i])) return false;
    if (versions[i] != o.versions[i] || scales[i] != o.scales[i]) return false;
  }
  return true;
}

WeightsFingerprint weights_fingerprint(const Qwen3Model& model) {
  WeightsFingerprint f;
  for (const auto& layer : model.layers())
    for (const auto& [name, lin] : layer.projections()) {
      (void)name;
      for (int w = 0; w < 2; ++w) {
        at::Tensor t = lin->lora ? (w == 0 ? lin->lora->A : lin->lora->B) : at::Tensor();
        f.tensors.push_back(t);
        f.versions.push_back(t.defined() ? static_cast<int64_t>(t._version()) : -1);
        f.scales.push_back(lin->lora ? lin->lora->scale : 0.0);
      }
    }
  return f;
}

int64_t EpisodeCacheEntry::bytes() const {
  int64_t n = 0;
  for (const auto& t : k) n += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& t : v) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

std::optional<EpisodeCacheEntry> EpisodeCacheStore::take(const std::string& key, const WeightsFingerprint& weights, bool* stale) {
  std::lock_guard<std::mutex> g(mu_);
  if (stale) *stale = false;
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  EpisodeCacheEntry e = std::move(it->second.entry);
  lru_.erase(it->second.lru);
  map_.erase(it);
  bytes_ -= e.bytes();
  tokens_ -= static_cast<int64_t>(e.tokens.size());
  if (!e.weights.same(weights)) {
    ++stale_;
    if (stale) *stale = true;
    return std::nullopt;
  }
  return e;
}

int64_t EpisodeCacheStore::put(const std::string& key, EpisodeCacheEntry&& e) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    bytes_ -= it->second.entry.bytes();
    tokens_ -= static_cast<int64_t>(it->second.entry.tokens.size());
    lru_.erase(it->second.lru);
    map_.erase(it);
  }
  bytes_ += e.bytes();
  tokens_ += static_cast<int64_t>(e.tokens.size());
  lru_.push_back(key);
  map_.emplace(key, Slot{std::move(e), std::prev(lru_.end())});
  return evict_locked();
}

int64_t EpisodeCacheStore::evict_locked() {
  int64_t n = 0;
  while (bytes_ > limit_ && !lru_.empty()) {
    auto it = map_.find(lru_.front());
    bytes_ -= it->second.entry.bytes();
    tokens_ -= static_cast<int64_t>(it->second.entry.tokens.size());
    map_.erase(it);
    lru_.pop_front();
    ++n;
  }
  evicted_ += n;
  return n;
}

void EpisodeCacheStore::release(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& key : keys) {
    auto it = map_.find(key);
    if (it == map_.end()) continue;
    bytes_ -= it->second.entry.bytes();
    tokens_ -= static_cast<int64_t>(it->second.entry.tokens.size());
    lru_.erase(it->second.lru);
    map_.erase(it);
  }
}

void EpisodeCacheStore::clear() {
  std::lock_guard<std::mutex> g(mu_);
  map_.clear();
  lru_.clear();
  bytes_ = tokens_ = 0;
}

void EpisodeCacheStore::set_limit(int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  limit_ = bytes;
  evict_locked();
}

EpisodeCacheStats EpisodeCacheStore::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  EpisodeCacheStats s;
  s.entries = static_cast<int64_t>(map_.size());
  s.tokens = tokens_;
  s.bytes = bytes_;
  s.limit_bytes = limit_;
  s.evicted = evicted_;
  s.stale = stale_;
  return s;
}

}  // namespace slm
