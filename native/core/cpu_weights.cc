#include "core/cpu_weights.h"

#include <cstdint>
#include <cstdio>
#include <string>
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace slm {

bool thp_advisable() {
#ifdef __linux__
  static const bool ok = [] {
    FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char buf[128] = {0};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const std::string v(buf, n);
    return v.find("[always]") != std::string::npos || v.find("[madvise]") != std::string::npos;
  }();
  return ok;
#else
  return false;
#endif
}

at::Tensor cpu_place_weight(const at::Tensor& t, at::ScalarType dtype) {
#ifdef __linux__
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t bytes = static_cast<size_t>(t.numel()) * c10::elementSize(dtype);
  if (bytes >= kHuge && (t.scalar_type() != dtype || thp_advisable())) {
    const size_t len = bytes + kHuge;  // room to align the start
    void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw != MAP_FAILED) {
      auto* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
      madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // a hint: refused is fine
      auto out = at::from_blob(
          p, t.sizes(), [raw, len](void*) { munmap(raw, len); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
      out.copy_(t);
      return out;
    }
  }
#endif
  return t.to(dtype);
}

}  // namespace slm
