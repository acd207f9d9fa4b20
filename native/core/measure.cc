#include "core/measure.h"

#include <ATen/ATen.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/cpu_gemm.h"
#include "core/cpu_weights.h"
#include "core/errors.h"
#include "core/qwen3.h"

namespace slm {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void sync(const at::Device& d) {
  if (d.is_cuda()) at::empty({1}, at::TensorOptions().device(d)).to(at::kCPU);  // forces the stream to drain
}
}  // namespace

double measure_matmul_gflops(int64_t n, const std::string& dtype, const std::string& device, double seconds) {
  at::Device dev(device);
  auto o = at::TensorOptions().dtype(parse_compute_dtype(dtype)).device(dev);
  auto a = at::randn({n, n}, o), b = at::randn({n, n}, o);
  // bfloat16 on a CPU without bfloat16 dot products: the rate of the engine's widened path
  // (cpu_linear_widened, float32 arithmetic), which every bfloat16 product of the engine takes there.
  const auto mm = [&]() {
    auto w = cpu_linear_widened(a, b);
    return w.defined() ? w : at::matmul(a, b);
  };
  auto c = mm();  // warm-up (thread pool, kernels)
  sync(dev);
  int64_t iters = 0;
  const double t0 = now();
  double t = t0;
  while (t - t0 < seconds || iters < 2) {
    c = mm();
    sync(dev);
    ++iters;
    t = now();
  }
  return 2.0 * n * n * n * iters / (t - t0) / 1e9;
}

double measure_copy_gbps(int64_t bytes, const std::string& device, double seconds) {
  at::Device dev(device);
  auto o = at::TensorOptions().dtype(at::kByte).device(dev);
  auto src = at::ones({bytes}, o), dst = at::empty({bytes}, o);
  dst.copy_(src);
  sync(dev);
  int64_t iters = 0;
  const double t0 = now();
  double t = t0;
  while (t - t0 < seconds || iters < 2) {
    dst.copy_(src);
    sync(dev);
    ++iters;
    t = now();
  }
  return 2.0 * static_cast<double>(bytes) * iters / (t - t0) / 1e9;
}

double measure_read_gbps(int64_t bytes, const std::string& device, double seconds) {
  at::Device dev(device);
  const int64_t words = std::max<int64_t>(1, bytes / 8);
  if (dev.is_cpu()) {
    // In memory placed as the engine places a large weight (huge pages where the kernel gives them),
    // read by every thread of the engine's pool, each its own contiguous share, as a decode's
    // projections read theirs: in blocks of 256 KiB, each read as four streams in step (a quarter of
    // the block apart), as the AVX2 row kernels read their rows. One stream per thread read 0.69-0.77 of
    // that on a 2-core Zen 3 (alternated, medians of 21), below what the kernels then streamed. The sum
    // of the words (all ones) keeps the reads (no compiler drops them) and shows every word was read
    // once: a pass that misses or repeats one is an error, not a rate. The loop vectorises at the
    // baseline ISA, whose loads outrun memory.
    const auto buf = cpu_place_weight(at::ones({words}, at::TensorOptions().dtype(at::kLong)), at::kLong);
    const auto* p = reinterpret_cast<const uint64_t*>(buf.data_ptr<int64_t>());
    const auto pass = [&] {
      std::atomic<uint64_t> seen{0};  // words read
      at::parallel_for(0, words, int64_t(1) << 16, [&](int64_t i0, int64_t i1) {
        constexpr int64_t kBlock = int64_t(1) << 15, kQuarter = kBlock / 4;  // words
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int64_t i = i0;
        for (; i + kBlock <= i1; i += kBlock)
          for (int64_t j = i; j < i + kQuarter; ++j) {
            a0 += p[j];
            a1 += p[j + kQuarter];
            a2 += p[j + 2 * kQuarter];
            a3 += p[j + 3 * kQuarter];
          }
        for (; i < i1; ++i) a0 += p[i];
        seen.fetch_add(a0 + a1 + a2 + a3, std::memory_order_relaxed);
      });
      const uint64_t read = seen.load();
      if (read != static_cast<uint64_t>(words))
        fail("NATIVE_ERROR", "the read-bandwidth probe read " + std::to_string(read) + " words of " + std::to_string(words) +
                                 "; its rate would be wrong. Report this as a bug.");
    };
    pass();  // warm-up (thread pool, pages)
    int64_t iters = 0;
    const double t0 = now();
    double t = t0;
    while (t - t0 < seconds || iters < 2) {
      pass();
      ++iters;
      t = now();
    }
    return static_cast<double>(words * 8) * iters / (t - t0) / 1e9;
  }
  // Elsewhere a reduction over the buffer, which reads every byte once.
  auto src = at::ones({words * 2}, at::TensorOptions().dtype(at::kFloat).device(dev));
  auto s = src.sum();
  sync(dev);
  int64_t iters = 0;
  const double t0 = now();
  double t = t0;
  while (t - t0 < seconds || iters < 2) {
    s = src.sum();
    sync(dev);
    ++iters;
    t = now();
  }
  return static_cast<double>(words * 8) * iters / (t - t0) / 1e9;
}

}  // namespace slm
