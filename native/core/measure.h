// Measurements of the machine's limits, taken in the same process as the benchmarks they bound.
#pragma once
#include <cstdint>
#include <string>

namespace slm {

// Sustained matrix-multiply rate in GFLOP/s for n x n x n products in `dtype` on `device`.
double measure_matmul_gflops(int64_t n, const std::string& dtype, const std::string& device, double seconds);
// Sustained copy bandwidth in GB/s (bytes read + bytes written per second) for a buffer of `bytes`.
double measure_copy_gbps(int64_t bytes, const std::string& device, double seconds);
// Sustained read bandwidth in GB/s (bytes read per second) of a buffer of `bytes`, placed on the CPU
// as a large weight is (cpu_place_weight): the bound of a decode step, which reads its weights and
// writes little. On a 2-core Zen 4 (2026-11-27) four pairs seconds apart read 0.79-1.65x the bytes per
// second `copy` moved: the machine's bandwidth moved between windows by more than the two kinds differ.
double measure_read_gbps(int64_t bytes, const std::string& device, double seconds);

}  // namespace slm
