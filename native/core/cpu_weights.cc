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

bool cpu_weight_copied(const at::Tensor& t, at::ScalarType dtype) { return t.scalar_type() != dtype || thp_advisable(); }

namespace {
constexpr size_t kHuge = size_t(2) << 20, kAlign = 64;
}

// The anonymous mapping: `raw`/`len` as mmap returned them, `base` its first 2 MiB boundary.
struct CpuWeightArena::Mapping {
  void* raw = nullptr;
  size_t len = 0;
  char* base = nullptr;
  ~Mapping() {
#ifdef __linux__
    if (raw) munmap(raw, len);
#endif
  }
};

CpuWeightArena::CpuWeightArena(size_t bytes) {
#ifdef __linux__
  if (bytes == 0) return;
  const size_t len = bytes + kHuge;  // room to align the start
  void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return;  // place() falls back to t.to(dtype)
  map_ = std::make_shared<Mapping>();
  map_->raw = raw;
  map_->len = len;
  map_->base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
  if (bytes >= kHuge) madvise(map_->base, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // a hint: refused is fine
  bytes_ = bytes;
#else
  (void)bytes;
#endif
}

size_t CpuWeightArena::slot_bytes(const at::Tensor& t, at::ScalarType dtype) {
  const size_t b = static_cast<size_t>(t.numel()) * c10::elementSize(dtype);
  return (b + kAlign - 1) / kAlign * kAlign;
}

at::Tensor CpuWeightArena::place(const at::Tensor& t, at::ScalarType dtype) {
  const size_t slot = slot_bytes(t, dtype);
  if (!map_ || !cpu_weight_copied(t, dtype) || slot > bytes_ - used_) return t.to(dtype);
  char* p = map_->base + used_;
  used_ += slot;
  auto keep = map_;  // each placed tensor holds the mapping
  auto out = at::from_blob(
      p, t.sizes(), [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
  out.copy_(t);
  return out;
}

at::Tensor cpu_place_weight(const at::Tensor& t, at::ScalarType dtype) {
  CpuWeightArena a(cpu_weight_copied(t, dtype) ? CpuWeightArena::slot_bytes(t, dtype) : 0);
  return a.place(t, dtype);
}

}  // namespace slm
