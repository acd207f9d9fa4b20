// A caching allocator for CPU tensors, installed as ATen's CPU allocator when the addon loads.
//
// Why: every async native call runs on one of libuv's pool threads, and each pool thread allocates
// from its own glibc malloc arena; a block freed in one arena is reused only by the thread that owns
// it, and an arena's heap that empties is unmapped (its pages faulted in, zeroed, again next time).
// A training step that lands on another pool thread than the last one so builds its whole working set
// anew: peak resident memory of the `small` preset's 512-token LoRA step grew to 2.7 GB without
// checkpointing (1.2 GB in one arena, MALLOC_ARENA_MAX=1) and faulted ~150,000 pages per step (2-core
// EPYC, 2026-11-27). glibc offers no per-arena control to a library, and MALLOC_ARENA_MAX only works
// when set before the process starts.
//
// What: blocks of kCachedMinBytes or more are kept when their tensor is freed, in one pool shared by
// every thread, and handed to the next request that fits (a cached block at most 1.25x the request);
// smaller ones go to malloc as before. The cached (free) bytes are capped (min(RAM / 8, 2 GiB)): over
// it, the blocks unused longest go back to malloc. cpu_cache_release() frees every cached block (the
// addon calls it before trimming malloc's heap, addon/workers.h). SLM_TRAIN_CPU_CACHE=0 leaves ATen's
// own allocator in place; SLM_TRAIN_CPU_CACHE=N caps the cached bytes at N MiB. Like ATen's CUDA
// caching allocator, this changes where tensors live, never their values: a fresh at::empty was never
// guaranteed zeroed (test/cpu-cache.test.ts: the same train steps, bit-equal losses with and without).
#pragma once
#include <cstdint>
#include <string>

namespace slm {

constexpr int64_t kCachedMinBytes = int64_t(64) << 10;

struct CpuCacheStats {
  bool installed = false;
  int64_t cached_bytes = 0;  // free blocks kept for reuse
  int64_t live_bytes = 0;    // blocks of kCachedMinBytes or more in use by tensors
  int64_t cap_bytes = 0;     // the most cached_bytes may reach
  int64_t hits = 0, misses = 0;
};

// Installs the allocator (once; later calls return what the first did). Returns what it did, for
// version().cpuCache and doctor: "caching blocks >= 64 KiB, at most N MiB cached" or why not.
std::string install_cpu_cache();
CpuCacheStats cpu_cache_stats();
// Frees every cached block (live blocks are untouched). Returns the bytes freed.
int64_t cpu_cache_release();

}  // namespace slm
