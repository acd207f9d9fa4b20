#include "core/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace slm {

struct MappedFile {
  void* data = nullptr;
  size_t size = 0;
  ~MappedFile() {
    if (data && data != MAP_FAILED) munmap(data, size);
  }
};

namespace {

at::ScalarType parse_dtype(const std::string& s, const std::string& name, const std::string& path) {
  if (s == "F32") return at::kFloat;
  if (s == "F16") return at::kHalf;
  if (s == "BF16") return at::kBFloat16;
  if (s == "F64") return at::kDouble;
  if (s == "I64") return at::kLong;
  if (s == "I32") return at::kInt;
  if (s == "I8") return at::kChar;
  if (s == "U8") return at::kByte;
  if (s == "BOOL") return at::kBool;
  fail("DTYPE_UNSUPPORTED", "tensor '" + name + "' in " + path + " has dtype " + s +
                                " — expected one of F32, F16, BF16 (also F64, I64, I32, I8, U8, BOOL). "
                                "Convert the checkpoint to one of these (e.g. with transformers' save_pretrained).");
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "F32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kDouble:
      return "F64";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      fail("DTYPE_UNSUPPORTED", std::string("cannot write a tensor of dtype ") + c10::toString(t) + " to safetensors");
  }
}

}  // namespace

void read_safetensors(const std::string& path, TensorMap& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("FILE_NOT_FOUND", "cannot open weights file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail("FILE_NOT_FOUND", "cannot stat " + path);
  }
  auto file = std::make_shared<MappedFile>();
  file->size = static_cast<size_t>(st.st_size);
  if (file->size < 8) {
    ::close(fd);
    fail("WEIGHTS_CORRUPT", path + " is " + std::to_string(file->size) +
                                " bytes: too short to be a safetensors file (expected an 8-byte header length, a JSON header and data). "
                                "Re-download or re-save it.");
  }
  // MAP_PRIVATE + PROT_WRITE: copy-on-write, so an accidental in-place op changes a private page and
  // never the file; pages are only read in practice, so nothing is copied.
  file->data = mmap(nullptr, file->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (file->data == MAP_FAILED) fail("WEIGHTS_CORRUPT", "cannot memory-map " + path + ": " + std::strerror(errno));
  const auto* bytes = static_cast<const uint8_t*>(file->data);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian hosts only (x86-64, aarch64)
  if (header_len > file->size - 8) {
    fail("WEIGHTS_CORRUPT", path + ": the header claims " + std::to_string(header_len) + " bytes but the file has only " +
                                std::to_string(file->size - 8) + " after the length field — the file is truncated or not safetensors.");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const std::exception& e) {
    fail("WEIGHTS_CORRUPT", path + ": the safetensors header is not valid JSON (" + std::string(e.what()) + ").");
  }
  if (!header.is_object()) fail("WEIGHTS_CORRUPT", path + ": the safetensors header is not a JSON object.");
  const size_t data_start = 8 + header_len;
  const size_t data_len = file->size - data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const auto& info = it.value();
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      fail("WEIGHTS_CORRUPT", path + ": header entry '" + name + "' lacks dtype, shape or data_offsets.");
    const auto dtype = parse_dtype(info["dtype"].get<std::string>(), name, path);
    std::vector<int64_t> shape = info["shape"].get<std::vector<int64_t>>();
    auto offs = info["data_offsets"].get<std::vector<uint64_t>>();
    if (offs.size() != 2 || offs[0] > offs[1]) fail("WEIGHTS_CORRUPT", path + ": tensor '" + name + "' has invalid data_offsets.");
    int64_t numel = 1;
    for (auto d : shape) {
      if (d < 0) fail("WEIGHTS_CORRUPT", path + ": tensor '" + name + "' has a negative dimension.");
      numel *= d;
    }
    const uint64_t nbytes = static_cast<uint64_t>(numel) * c10::elementSize(dtype);
    if (offs[1] - offs[0] != nbytes)
      fail("WEIGHTS_CORRUPT", path + ": tensor '" + name + "' should take " + std::to_string(nbytes) +
                                  " bytes for its shape and dtype but its offsets span " + std::to_string(offs[1] - offs[0]) + ".");
    if (offs[1] > data_len)
      fail("WEIGHTS_CORRUPT", path + ": tensor '" + name + "' ends at byte " + std::to_string(offs[1]) +
                                  " of the data section, which has only " + std::to_string(data_len) +
                                  " bytes — the file is truncated. Re-download or re-save it.");
    if (out.tensors.count(name))
      fail("WEIGHTS_CORRUPT", "tensor '" + name + "' appears both in " + out.source[name] + " and in " + path + ".");
    void* ptr = const_cast<uint8_t*>(bytes) + data_start + offs[0];
    at::Tensor t;
    const auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
    if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(dtype) == 0) {
      auto keep = file;  // the tensor holds the mapping alive
      t = at::from_blob(
          ptr, shape, [keep](void*) mutable { keep.reset(); }, opts);
    } else {
      // Misaligned data (rare; the format does not require alignment): one copy is unavoidable.
      t = at::empty(shape, opts);
      std::memcpy(t.data_ptr(), ptr, nbytes);
    }
    out.tensors.emplace(name, t);
    out.source.emplace(name, path);
  }
}

TensorMap read_safetensors_files(const std::vector<std::string>& paths) {
  TensorMap out;
  for (const auto& p : paths) read_safetensors(p, out);
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t off = 0;
  for (const auto& [name, t0] : tensors) {
    auto t = t0.detach().to(at::kCPU).contiguous();
    const uint64_t n = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + n}}};
    off += n;
    cpu.push_back(t);
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) fail("FILE_NOT_FOUND", "cannot write " + tmp);
    uint64_t len = h.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : cpu) f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    if (!f) fail("FILE_NOT_FOUND", "failed writing " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("FILE_NOT_FOUND", "cannot rename " + tmp + " to " + path);
}

}  // namespace slm
