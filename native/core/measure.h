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
// writes little. On a 2-core Zen 4 it read 1.1-1.3x the bytes per second `copy` moved (2026-11-27).
double measure_read_gbps(int64_t bytes, const std::string& device, double seconds);

}  // namespace slm
