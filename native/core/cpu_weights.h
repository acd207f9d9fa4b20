// Where a model's weights live in CPU memory once loaded.
#pragma once
#include <ATen/ATen.h>

namespace slm {

// A checkpoint tensor placed on the CPU in `dtype`. One of 2 MiB or more goes into memory whose whole
// 2 MiB pages are advised as transparent huge pages before it is first written (MADV_HUGEPAGE; the tail
// past the last whole page keeps 4 KiB pages, so no huge page is left partly unused): when it is
// converted to another dtype, and, where the kernel gives huge pages to advised memory (THP "always"
// or "madvise"), also when it is used in its own dtype, copied out of the file's memory map, whose
// page-cache pages are mapped 4 KiB at a time. A decode step reads every weight, and with huge pages
// needs ~500x fewer TLB entries for them. On a 2-core Zen 4 (kernel 6.18), the `small` preset: a
// bfloat16 decode step took 0.88-0.90 of the time of the same weights in 4 KiB pages (alternated in one
// process), and a float32 one at batch 1 ~0.8 of its time with the weights left in the checkpoint's
// memory map (alternated pairs of processes, 2026-11-27: 18.6-21.1 against 14.7-17.2 ms). Anything else
// (smaller, no huge pages to be had in the same dtype): `t.to(dtype)`, which is `t` itself when the dtype
// matches (it stays in the memory map).
at::Tensor cpu_place_weight(const at::Tensor& t, at::ScalarType dtype);

// Whether this kernel gives transparent huge pages to memory advised for them ("always" or "madvise").
bool thp_advisable();

}  // namespace slm
