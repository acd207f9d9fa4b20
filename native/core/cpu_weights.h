// Where a model's weights live in CPU memory once loaded.
#pragma once
#include <ATen/ATen.h>

#include <cstddef>
#include <memory>

namespace slm {

// Whether a checkpoint tensor is copied when placed on the CPU in `dtype`: when it is converted, and,
// where the kernel gives huge pages to advised memory (THP "always" or "madvise", thp_advisable()),
// when it is used in its own dtype too (copied out of the file's memory map, whose page-cache pages
// are mapped 4 KiB at a time). Otherwise (same dtype, no huge pages to be had) it stays in the map.
bool cpu_weight_copied(const at::Tensor& t, at::ScalarType dtype);

// A model's weights on the CPU: one anonymous mapping sized for every weight that is copied
// (cpu_weight_copied), the weights laid out in it one after another in load order (each at a 64-byte
// boundary), its whole 2 MiB pages advised as transparent huge pages before the first write
// (MADV_HUGEPAGE; the tail past the last whole page keeps 4 KiB pages, so no huge page is left partly
// unused). A decode step reads every weight in that order: with huge pages it needs ~500x fewer TLB
// entries, and one projection's weights follow the previous one's in memory. Before, each weight had
// a mapping of its own and one under 2 MiB had 4 KiB pages (the `small` preset's projections in
// bfloat16, its attention projections in float32); on a 2-core Zen 4 (2026-11-27, timers around each
// call, three alternated pairs of processes) the 56 projection calls of a batch-1 decode step took
// 43-44 µs each in bfloat16 then, 29-33 µs here, and 72-83 µs in float32 then, 52-55 µs here. The
// mapping is unmapped when the last tensor placed in it is freed.
class CpuWeightArena {
 public:
  // `bytes`: the sum over the tensors to place of their size in the compute dtype, each rounded up
  // to a multiple of 64 (slot_bytes). 0: nothing is copied; place() then only converts.
  explicit CpuWeightArena(size_t bytes);
  static size_t slot_bytes(const at::Tensor& t, at::ScalarType dtype);
  // `t` in `dtype`: copied into the arena's next slot when cpu_weight_copied(t, dtype) and there is
  // room; otherwise t.to(dtype) (t itself when the dtype matches).
  at::Tensor place(const at::Tensor& t, at::ScalarType dtype);

 private:
  struct Mapping;
  std::shared_ptr<Mapping> map_;
  size_t bytes_ = 0, used_ = 0;
};

// One tensor placed as a model's weights are (an arena of its own): the read-bandwidth probe's buffer.
at::Tensor cpu_place_weight(const at::Tensor& t, at::ScalarType dtype);

// Whether this kernel gives transparent huge pages to memory advised for them ("always" or "madvise").
bool thp_advisable();

}  // namespace slm
