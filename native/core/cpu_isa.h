// Which instruction set the CPU kernels use: what the CPU offers, capped by SLM_TRAIN_CPU_ISA (or by
// set_cpu_isa_cap, for tests and benchmarks). One kernel source per concept is compiled for each level
// (core/simd.h) and picked here at run time, as ATen's DispatchStub picks its CPU_CAPABILITY.
//
// Levels, from the most to the least: avx512-bf16 (AVX-512 F/BW with bfloat16 dot products),
// avx512 (AVX-512 F/BW: bfloat16 stored, multiplied in float32), avx2 (AVX2 + FMA: the same with 8
// lanes), none (no vector kernels: ATen's operations, the path every other device takes, and scalar
// loops where a kernel has one).
#pragma once
#include <string>

namespace slm {

enum class CpuIsa { None = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };

// What this CPU supports (detected once).
CpuIsa cpu_isa_detected();
// What the kernels use: the detected level capped by SLM_TRAIN_CPU_ISA (read at the first call; an
// unknown value caps nothing: the TypeScript layer refuses it with a coded error before loading) and
// by set_cpu_isa_cap.
CpuIsa cpu_isa();
// Caps the level (a level above the CPU's gives the CPU's); returns the level now in force.
CpuIsa set_cpu_isa_cap(CpuIsa cap);

// "avx512-bf16", "avx512", "avx2", "none".
const char* cpu_isa_name(CpuIsa isa);
// The level a name stands for; false when the name is none of the above.
bool parse_cpu_isa(const std::string& name, CpuIsa* out);

}  // namespace slm
