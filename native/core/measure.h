// Measurements of the machine's limits, taken in the same process as the benchmarks they bound.
#pragma once
#include <string>

namespace slm {

// Sustained matrix-multiply rate in GFLOP/s for n x n x n products in `dtype` on `device`.
double measure_matmul_gflops(int64_t n, const std::string& dtype, const std::string& device, double seconds);
// Sustained copy bandwidth in GB/s (bytes read + bytes written per second) for a buffer of `bytes`.
double measure_copy_gbps(int64_t bytes, const std::string& device, double seconds);

}  // namespace slm
