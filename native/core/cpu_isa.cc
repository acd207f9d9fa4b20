#include "core/cpu_isa.h"

#include <atomic>
#include <cstdlib>

namespace slm {

namespace {

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return __builtin_cpu_supports("avx512bf16") ? CpuIsa::Avx512Bf16 : CpuIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::Avx2;
#endif
  return CpuIsa::None;
}

CpuIsa env_cap() {
  const char* v = std::getenv("SLM_TRAIN_CPU_ISA");
  CpuIsa cap = CpuIsa::Avx512Bf16;
  if (v && *v) parse_cpu_isa(v, &cap);
  return cap;
}

CpuIsa lower(CpuIsa a, CpuIsa b) { return static_cast<int>(a) < static_cast<int>(b) ? a : b; }

std::atomic<int>& in_force() {
  static std::atomic<int> level{static_cast<int>(lower(cpu_isa_detected(), env_cap()))};
  return level;
}

}  // namespace

CpuIsa cpu_isa_detected() {
  static const CpuIsa d = detect();
  return d;
}

CpuIsa cpu_isa() { return static_cast<CpuIsa>(in_force().load(std::memory_order_relaxed)); }

CpuIsa set_cpu_isa_cap(CpuIsa cap) {
  const CpuIsa now = lower(cpu_isa_detected(), cap);
  in_force().store(static_cast<int>(now));
  return now;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512Bf16:
      return "avx512-bf16";
    case CpuIsa::Avx512:
      return "avx512";
    case CpuIsa::Avx2:
      return "avx2";
    default:
      return "none";
  }
}

bool parse_cpu_isa(const std::string& name, CpuIsa* out) {
  for (CpuIsa i : {CpuIsa::Avx512Bf16, CpuIsa::Avx512, CpuIsa::Avx2, CpuIsa::None})
    if (name == cpu_isa_name(i)) {
      *out = i;
      return true;
    }
  return false;
}

}  // namespace slm
