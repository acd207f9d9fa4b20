// Machine measurements as async workers (doctor, benchmarks' rooflines).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__GLIBC__)
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#endif

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/cpu_cache.h"
#include "core/measure.h"

namespace slm_addon {

#if defined(__GLIBC__)
namespace {
// Resident bytes of this process (/proc/self/statm), or -1.
int64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}
}  // namespace
#endif

void release_free_memory() {
#if defined(__GLIBC__)
  // Trim when resident memory has grown by more than `slack` over what it was after the last trim:
  // a call's working set is then reused by the next call (no re-fault) while fragmentation stays
  // bounded. Slack: a quarter of physical memory, at most 4 GiB.
  static std::atomic<int64_t> after_trim{-1};
  static const int64_t slack =
      std::min<int64_t>(int64_t(4) << 30, static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 4);
  const int64_t rss = resident_bytes();
  const int64_t base = after_trim.load();
  if (rss >= 0 && base >= 0 && rss < base + slack) return;
  slm::cpu_cache_release();  // the tensors' cached blocks first (core/cpu_cache.h), then malloc's heap
  malloc_trim(0);
  after_trim.store(resident_bytes());
#endif
}

std::string tune_malloc() {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_") ||
      (tunables && std::strstr(tunables, "glibc.malloc.")))
    return "the user's (MALLOC_*_THRESHOLD_ or GLIBC_TUNABLES)";
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
  return ok ? "mmap threshold 32 MiB, trim threshold 256 MiB" : "glibc's defaults (mallopt refused)";
#else
  return "the C library's defaults (not glibc)";
#endif
}

// measure({kind: 'matmul'|'copy'|'read', n, dtype?, device?, seconds?}) -> Promise<number> (GFLOP/s or GB/s)
Napi::Value Measure(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "measure expects {kind, n, dtype?, device?, seconds?}.");
  auto o = info[0].As<Napi::Object>();
  auto kind = str_field(env, o, "kind", "matmul");
  if (kind != "matmul" && kind != "copy" && kind != "read")
    throw_error(env, "ARGUMENT_INVALID", "measure kind must be 'matmul', 'copy' or 'read', found '" + kind + "'.");
  const int64_t n = int_field(env, o, "n", kind == "matmul" ? 1024 : (int64_t(256) << 20));
  auto dtype = str_field(env, o, "dtype", "float32"), device = str_field(env, o, "device", "cpu");
  const double seconds = num_field(env, o, "seconds", 0.5);
  auto value = std::make_shared<double>(0);
  return LambdaWorker::Start(
      env, "slm:measure", Napi::Object(),
      [kind, n, dtype, device, seconds, value] {
        c10::InferenceMode guard;
        *value = kind == "matmul" ? slm::measure_matmul_gflops(n, dtype, device, seconds)
                 : kind == "copy" ? slm::measure_copy_gbps(n, device, seconds)
                                  : slm::measure_read_gbps(n, device, seconds);
      },
      [value](Napi::Env e) { return Napi::Number::New(e, *value); });
}

}  // namespace slm_addon
