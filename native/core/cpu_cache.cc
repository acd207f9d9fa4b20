#include "core/cpu_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

namespace slm {
namespace {

constexpr size_t kAlignment = 64;  // as ATen's own CPU allocator (c10::gAlignment)

struct Pool {
  using Free = std::multimap<size_t, std::pair<void*, uint64_t>>;  // size -> (cached block, when it was freed)
  std::mutex mu;
  Free free_;
  std::map<uint64_t, Free::iterator> age_;  // the cached blocks, the longest unused first
  std::unordered_map<void*, size_t> live_;  // cached-size block in use -> its size
  uint64_t clock = 0;
  CpuCacheStats s;  // what cpu_cache_stats() returns, kept as it changes
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: tensors may be freed during exit
  return *p;
}

void* aligned_alloc_or_null(size_t n) {
  void* p = nullptr;
  return posix_memalign(&p, kAlignment, std::max<size_t>(n, 1)) == 0 ? p : nullptr;
}

// Takes a cached block out of the pool (not freed). Under the lock.
void unlink_locked(Pool& P, Pool::Free::iterator it) {
  P.age_.erase(it->second.second);
  P.s.cached_bytes -= static_cast<int64_t>(it->first);
  P.free_.erase(it);
}

// Frees cached blocks, the longest unused first, until at most `keep` bytes stay cached. Under the lock.
void evict_locked(Pool& P, int64_t keep) {
  while (P.s.cached_bytes > keep && !P.age_.empty()) {
    auto it = P.age_.begin()->second;
    void* p = it->second.first;
    unlink_locked(P, it);
    std::free(p);
  }
}

// The deleter of every block this allocator hands out (raw_deleter requires one for all of them).
void release_block(void* p) {
  if (!p) return;
  auto& P = pool();
  {
    std::lock_guard<std::mutex> g(P.mu);
    auto it = P.live_.find(p);
    if (it != P.live_.end()) {
      const size_t n = it->second;
      P.live_.erase(it);
      P.s.live_bytes -= static_cast<int64_t>(n);
      if (static_cast<int64_t>(n) <= P.s.cap_bytes) {
        // Over the cap, the blocks unused longest make room (sizes drift as batches change length).
        evict_locked(P, P.s.cap_bytes - static_cast<int64_t>(n));
        const uint64_t t = ++P.clock;
        P.age_.emplace(t, P.free_.emplace(n, std::make_pair(p, t)));
        P.s.cached_bytes += static_cast<int64_t>(n);
        return;
      }
    }
  }
  std::free(p);
}

void* take_block(size_t n) {
  auto& P = pool();
  if (static_cast<int64_t>(n) < kCachedMinBytes) return aligned_alloc_or_null(n);
  const size_t want = (n + 4095) & ~size_t(4095);
  {
    std::lock_guard<std::mutex> g(P.mu);
    auto it = P.free_.lower_bound(want);
    if (it != P.free_.end() && it->first <= want + want / 4) {
      void* p = it->second.first;
      const size_t size = it->first;
      unlink_locked(P, it);
      P.live_.emplace(p, size);
      P.s.live_bytes += static_cast<int64_t>(size);
      ++P.s.hits;
      return p;
    }
    ++P.s.misses;
  }
  void* p = aligned_alloc_or_null(want);
  if (!p) {  // out of memory: give the cache back and try once more
    cpu_cache_release();
    p = aligned_alloc_or_null(want);
    if (!p) return nullptr;
  }
  std::lock_guard<std::mutex> g(P.mu);
  P.live_.emplace(p, want);
  P.s.live_bytes += static_cast<int64_t>(want);
  return p;
}

struct CachingCpuAllocator final : c10::Allocator {
  c10::DataPtr make(size_t n) const {
    void* p = take_block(n);
    if (!p && n) throw std::bad_alloc();  // the addon reports OUT_OF_MEMORY with what to do (addon/errors_impl.h)
    return {p, p, &release_block, c10::Device(c10::DeviceType::CPU)};
  }
  // ATen 1.x declares allocate const, 2.x (2.3 and later) not: both are defined, one overrides.
  c10::DataPtr allocate(size_t n) const { return make(n); }
  c10::DataPtr allocate(size_t n) { return make(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &release_block; }
  // Pure virtual in ATen 2.3 and later (clone); a plain member before.
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
};

}  // namespace

std::string install_cpu_cache() {
  static const std::string what = [] {
    // SLM_TRAIN_CPU_CACHE: 0 (or 00, ...) off, N the cap in MiB (lib/engine/runtime.ts refuses anything
    // but digits before the addon loads); unset or empty: the default cap.
    const char* e = std::getenv("SLM_TRAIN_CPU_CACHE");
    char* end = nullptr;
    const long long mib = e && *e ? std::strtoll(e, &end, 10) : -1;
    const bool given = mib >= 0 && end && *end == 0;
    if (given && mib == 0) return std::string("SLM_TRAIN_CPU_CACHE=0: ATen's CPU allocator");
    auto& P = pool();
    const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    P.s.cap_bytes = given ? static_cast<int64_t>(mib) << 20 : std::min<int64_t>(int64_t(2) << 30, ram > 0 ? ram / 8 : int64_t(1) << 30);
    static auto* alloc = new CachingCpuAllocator();  // never destroyed, as the pool: ATen keeps the pointer
    c10::SetAllocator(c10::DeviceType::CPU, alloc, /*priority=*/1);
    P.s.installed = true;
    return "caching blocks >= " + std::to_string(kCachedMinBytes >> 10) + " KiB, at most " + std::to_string(P.s.cap_bytes >> 20) +
           " MiB cached";
  }();
  return what;
}

CpuCacheStats cpu_cache_stats() {
  auto& P = pool();
  std::lock_guard<std::mutex> g(P.mu);
  return P.s;
}

int64_t cpu_cache_release() {
  auto& P = pool();
  std::lock_guard<std::mutex> g(P.mu);
  const int64_t before = P.s.cached_bytes;
  evict_locked(P, 0);
  return before;
}

}  // namespace slm
