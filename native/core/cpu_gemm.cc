#include "core/cpu_gemm.h"

#include "core/cpu_isa.h"
#include "core/simd.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace slm {

namespace {

// The most input rows the row kernels (rows_512, rows_bf16_512, rows_256) take at once.
constexpr int64_t kRowsMaxInputs = 2;

std::atomic<bool> g_enabled{true};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SLM_X86 1
#define T512 __attribute__((target("avx512f,avx512bw")))
#define T512BF __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define T256 __attribute__((target("avx2,fma")))

#include "core/cpu_gemm_impl.h"
#endif  // x86

}  // namespace

const char* cpu_small_linear_isa() {
  switch (cpu_isa()) {
    case CpuIsa::Avx512Bf16:
      return "avx512-bf16 (float32; bfloat16 dot products)";
    case CpuIsa::Avx512:
      return "avx512 (float32; bfloat16 stored, float32 arithmetic)";
    case CpuIsa::Avx2:
      return "avx2 (float32; bfloat16 stored, float32 arithmetic)";
    default:
      return "none";
  }
}

at::Tensor cpu_linear_widened(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const CpuIsa i = cpu_isa();
  if (!g_enabled.load(std::memory_order_relaxed) || (i != CpuIsa::Avx2 && i != CpuIsa::Avx512)) return {};
  if (!x.is_cpu() || !w.is_cpu() || x.scalar_type() != at::kBFloat16 || w.scalar_type() != at::kBFloat16 || w.dim() != 2 || w.size(1) == 0)
    return {};
  if (bias.defined() && (bias.scalar_type() != at::kBFloat16 || !bias.is_cpu())) return {};
  const int64_t N = w.size(0), block = std::max<int64_t>(1, (int64_t(16) << 20) / (4 * w.size(1)));
  const auto xf = x.to(at::kFloat);
  std::vector<at::Tensor> parts;
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t n = std::min(block, N - n0);
    const auto wf = w.narrow(0, n0, n).to(at::kFloat);
    parts.push_back(bias.defined() ? at::linear(xf, wf, bias.narrow(0, n0, n).to(at::kFloat)) : at::linear(xf, wf));
  }
  return (parts.size() == 1 ? parts[0] : at::cat(parts, -1)).to(at::kBFloat16);
}

void set_cpu_kernels_enabled(bool on) { g_enabled.store(on); }
bool cpu_kernels_enabled() { return g_enabled.load(); }

at::Tensor cpu_small_linear(const at::Tensor& x, const at::Tensor& w, bool float_out, const at::Tensor& out) {
#ifdef SLM_X86
  if (!g_enabled.load(std::memory_order_relaxed)) return {};
  const CpuIsa i = cpu_isa();
  if (i == CpuIsa::None || !x.is_cpu() || !w.is_cpu() || x.scalar_type() != w.scalar_type() || w.dim() != 2) return {};
  const auto dt = x.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16) return {};
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) return {};
  const int64_t K = w.size(1), N = w.size(0);
  if (x.dim() < 1 || x.size(-1) != K || K == 0 || N == 0) return {};
  const int64_t M = x.numel() / K;
  if (M < 1 || M > kSmallLinearMaxRows) return {};
  const auto wc = w.is_contiguous() ? w : w.contiguous();
  // bfloat16 without bfloat16 dot products: the input rows widened to float32 once (M x K values),
  // the weights widened in registers as they are read.
  const bool dot_bf16 = dt == at::kBFloat16 && i == CpuIsa::Avx512Bf16;
  const auto xc = dt == at::kBFloat16 && !dot_bf16 ? x.to(at::kFloat).contiguous() : x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  const auto ydt = float_out ? at::kFloat : dt;
  at::Tensor y;
  if (out.defined() && out.is_cpu() && out.scalar_type() == ydt && out.is_contiguous() && out.numel() >= M * N)
    y = out.view({-1}).narrow(0, 0, M * N).view(sizes);  // the caller's buffer: its pages stay mapped
  else
    y = at::empty(sizes, x.options().dtype(ydt));
  // Tiles of weight rows per task: enough work per task (~64k multiply-adds) that a small product
  // stays on one thread instead of paying for a parallel region.
  const bool avx2 = i == CpuIsa::Avx2, few = M <= 2;  // AVX2: 3 weight rows per tile, 4 for one or two input rows
  const int64_t nr = avx2 && !few ? 3 : 4;
  // The row kernels for one or two input rows (each weight row read once, whole, then multiplied with
  // each input row from L1), the tiles from three on; bfloat16 widened in registers, for one only (each
  // input row would widen the weights again: the vocabulary head alone at two rows took 1.44-2.58x
  // the tiles' time on the AVX2 path, 0.93-1.72x on AVX-512). Measured on a 2-core Zen 4, a decode
  // step at 2 rows in alternated processes: float32 0.64-0.97 of the tiles' time (8 pairs), capped to
  // AVX2 0.89-0.93 (6), bfloat16 dot products 0.79-1.02 (5); at 4 rows float32 0.98-1.11 and bfloat16
  // 1.02-1.09 of it: not taken.
  const bool widened = dt == at::kBFloat16 && !dot_bf16;
  const bool rows = M <= (widened ? 1 : kRowsMaxInputs);  // whole weight rows: rows_512 / rows_bf16_512, AVX2 rows_256
  // More than kFarMaxInputs rows on the AVX2 tiles: x packed once here for every thread (pack_rows_256).
  // On the 2-core Zen 3: the tiles alone outside the project (48 rows against the vocabulary head's
  // 151,936 x 512 and 30,000 x 512 / 1,536, alternated, medians of 11-31) 1.05-1.11x; a float32 decode
  // step at 48 rows in alternated processes, 8 pairs on a noisy VM: mean 1.05x, median pair 1.02x
  // (0.93-1.28); bfloat16 1.01-1.07x (2 pairs). Outputs bit-identical (the same sums in the same order).
  // (xc is float32 on the AVX2 path: bfloat16 was widened above.) The buffer comes from ATen's CPU
  // allocator (core/cpu_cache.h: 64-byte aligned, large blocks reused), so a step's 32-byte loads never
  // straddle two cache lines (from a 16-byte aligned buffer the float32 decode at 48 rows was
  // 0.87-0.96x the unpacked one's, not faster).
  const bool pack = avx2 && !rows && M > kFarMaxInputs;
  const auto packed = pack ? at::empty({pack_size_256(M, K)}, xc.options()) : at::Tensor();
  const float* xp = pack ? packed.data_ptr<float>() : nullptr;
  if (pack) pack_rows_256(xc.data_ptr<float>(), M, K, packed.data_ptr<float>());
  const int64_t tiles = (N + nr - 1) / nr;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, nr * M * K));
  const auto body = [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * nr, n1 = std::min(N, t1 * nr);
    if (dt == at::kBFloat16 && !dot_bf16) {
      const float* xf = xc.data_ptr<float>();
      const auto* wb = reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>());
      const bool wide = !avx2;
      if (rows && float_out)
        (wide ? rows_512<uint16_t, float> : rows_256<4, uint16_t, float>)(xf, M, wb, K, y.data_ptr<float>(), N, n0, n1);
      else if (rows)
        (wide ? rows_512<uint16_t, uint16_t>
              : rows_256<4, uint16_t, uint16_t>)(xf, M, wb, K, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, n0, n1);
      else if (float_out && wide)
        range_wbf16f_512(xf, M, wb, K, y.data_ptr<float>(), N, n0, n1);
      else if (float_out)
        (few ? range_wbf16f_256w : range_wbf16f_256)(xf, M, wb, K, y.data_ptr<float>(), N, n0, n1, xp);
      else if (wide)
        range_wbf16_512(xf, M, wb, K, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, n0, n1);
      else
        (few ? range_wbf16_256w : range_wbf16_256)(xf, M, wb, K, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, n0, n1, xp);
    } else if (dt == at::kBFloat16) {
      const auto* xb = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
      const auto* wb = reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>());
      if (rows && float_out)
        rows_bf16_512<uint16_t, float>(xb, M, wb, K, y.data_ptr<float>(), N, n0, n1);
      else if (rows)
        rows_bf16_512<uint16_t, uint16_t>(xb, M, wb, K, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, n0, n1);
      else if (float_out)
        range_bf16f_512(xb, M, wb, K, y.data_ptr<float>(), N, n0, n1);
      else
        range_bf16_512(xb, M, wb, K, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), N, n0, n1);
    } else if (rows) {
      (avx2 ? rows_256<4, float, float> : rows_512<float, float>)(xc.data_ptr<float>(), M, wc.data_ptr<float>(), K, y.data_ptr<float>(), N,
                                                                  n0, n1);
    } else if (avx2) {
      (few ? range_f32_256w : range_f32_256)(xc.data_ptr<float>(), M, wc.data_ptr<float>(), K, y.data_ptr<float>(), N, n0, n1, xp);
    } else {
      range_f32_512(xc.data_ptr<float>(), M, wc.data_ptr<float>(), K, y.data_ptr<float>(), N, n0, n1);
    }
  };
  // Guided self-scheduling: each thread takes its next share off a counter (half of what is left per
  // thread, at least `grain` tiles) instead of a fixed half, so a thread the OS or the hypervisor
  // preempts does not hold the others at the end of the call (the server's HTTP thread and its clients
  // share the cores; so does a VM). The shares only change which thread computes a row, never its sums.
  // Alternated in one process with the fixed split on the 2-core Zen 3 (paired medians): a decode step
  // 1.04-1.14x as fast at batch 16 in float32 (3 runs), 1.12x in bfloat16, 1.11x at 48 rows, 0.99-1.00x
  // at batch 1.
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (tiles + grain - 1) / grain));
  std::atomic<int64_t> next{0};
  const auto take = [&] {
    int64_t t0 = next.load(std::memory_order_relaxed), c = 0;
    do {
      const int64_t left = tiles - t0;
      if (left <= 0) return std::pair<int64_t, int64_t>(tiles, tiles);
      c = std::min(left, std::max(grain, left / (2 * nt)));
    } while (!next.compare_exchange_weak(t0, t0 + c, std::memory_order_relaxed));
    return std::pair<int64_t, int64_t>(t0, t0 + c);
  };
  // One task per thread (inside another parallel region at::parallel_for runs it inline: it takes all).
  at::parallel_for(0, nt, 1, [&](int64_t, int64_t) {
    for (auto r = take(); r.first < r.second; r = take()) body(r.first, r.second);
  });
  return y;
#else
  (void)x;
  (void)w;
  (void)float_out;
  (void)out;
  return {};
#endif
}

}  // namespace slm
