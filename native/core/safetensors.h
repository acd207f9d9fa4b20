// safetensors reader: memory-maps each file and returns tensors that view the mapped bytes directly
// (no copy). A tensor keeps its mapping alive. Format: 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
#pragma once
#include <ATen/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace slm {

struct MappedFile;  // an mmap'd file; unmapped when the last tensor viewing it is gone

struct TensorMap {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> source;  // tensor name -> file it came from (for error messages)
};

// Reads one file and adds its tensors to `out`. Errors: FILE_NOT_FOUND, WEIGHTS_CORRUPT (truncated
// file, bad header, offsets outside the file, overlapping names), DTYPE_UNSUPPORTED.
void read_safetensors(const std::string& path, TensorMap& out);

// Reads every file (the shards of one checkpoint); a tensor name found twice is an error.
TensorMap read_safetensors_files(const std::vector<std::string>& paths);

// Writes tensors (any device/dtype F32/F16/BF16) to a safetensors file (for adapters and tests).
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace slm
