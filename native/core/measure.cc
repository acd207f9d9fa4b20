#include "core/measure.h"

#include <ATen/ATen.h>

#include <chrono>

#include "core/cpu_gemm.h"
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

}  // namespace slm
