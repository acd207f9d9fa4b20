// The GPU check's shared helpers (check.h): fixtures, the model loader, device helpers.
#include "check.h"

#include "core/lora.h"
#include "core/safetensors.h"

#ifdef SLM_CHECK_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace slm_check {

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  return json::parse(f);
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// config.json -> the core's config (what lib/model/config.ts passes for qwen3 / qwen2 / llama).
slm::Qwen3Config read_config(const json& c) {
  slm::Qwen3Config cfg;
  auto num = [&](const char* k, double d) { return c.contains(k) && c[k].is_number() ? c[k].get<double>() : d; };
  cfg.vocab_size = (int64_t)num("vocab_size", 0);
  cfg.hidden_size = (int64_t)num("hidden_size", 0);
  cfg.intermediate_size = (int64_t)num("intermediate_size", 0);
  cfg.num_hidden_layers = (int64_t)num("num_hidden_layers", 0);
  cfg.num_attention_heads = (int64_t)num("num_attention_heads", 1);
  cfg.num_key_value_heads = (int64_t)num("num_key_value_heads", (double)cfg.num_attention_heads);
  cfg.head_dim = (int64_t)num("head_dim", (double)(cfg.hidden_size / cfg.num_attention_heads));
  cfg.rope_theta = num("rope_theta", 1e6);
  cfg.rms_norm_eps = num("rms_norm_eps", 1e-6);
  cfg.tie_word_embeddings = c.value("tie_word_embeddings", false);
  std::string mt = c.value("model_type", std::string("qwen3"));
  cfg.arch.model_type = mt;
  bool attention_bias = c.value("attention_bias", false);
  cfg.arch.qk_norm = mt == "qwen3";
  cfg.arch.qkv_bias = mt == "qwen2" || attention_bias;
  cfg.arch.o_bias = mt != "qwen2" && attention_bias;
  cfg.arch.mlp_bias = c.value("mlp_bias", false);
  // transformers 5 writes rope_parameters ({rope_theta, rope_type, factor, ...}) where earlier
  // checkpoints have rope_theta and rope_scaling; both are read, the older keys first (as
  // lib/model/config.ts reads them).
  const json* rp = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? &c["rope_parameters"] : nullptr;
  if (!(c.contains("rope_theta") && c["rope_theta"].is_number()) && rp && rp->contains("rope_theta") && (*rp)["rope_theta"].is_number())
    cfg.rope_theta = (*rp)["rope_theta"].get<double>();
  const json* rs = c.contains("rope_scaling") && c["rope_scaling"].is_object() ? &c["rope_scaling"] : rp;
  if (rs) {
    const json& r = *rs;
    cfg.rope_scaling.type = r.value("rope_type", r.value("type", std::string("default")));
    cfg.rope_scaling.factor = r.value("factor", 1.0);
    cfg.rope_scaling.low_freq_factor = r.value("low_freq_factor", 1.0);
    cfg.rope_scaling.high_freq_factor = r.value("high_freq_factor", 4.0);
    cfg.rope_scaling.original_max_position_embeddings = r.value("original_max_position_embeddings", 8192.0);
  }
  return cfg;
}

std::unique_ptr<slm::Qwen3Model> load_model(const std::string& dir, const std::string& adapter_dir, at::ScalarType dtype,
                                            const std::string& device) {
  slm::Qwen3Config cfg = read_config(read_json(dir + "/config.json"));
  std::vector<std::string> files;
  if (exists(dir + "/model.safetensors.index.json")) {
    std::set<std::string> seen;
    const json index = read_json(dir + "/model.safetensors.index.json");  // kept alive for the loop
    for (auto& [name, file] : index["weight_map"].items())
      if (seen.insert(file.get<std::string>()).second) files.push_back(dir + "/" + file.get<std::string>());
  } else {
    files.push_back(dir + "/model.safetensors");
  }
  slm::LoadOptions lo;
  lo.dtype = dtype;
  lo.device = device;
  auto m = std::make_unique<slm::Qwen3Model>(cfg, slm::read_safetensors_files(files), lo);
  if (!adapter_dir.empty()) {
    json a = read_json(adapter_dir + "/adapter_config.json");
    slm::LoraConfig lc;
    lc.r = a["r"].get<int64_t>();
    lc.alpha = a["lora_alpha"].get<double>();
    lc.dropout = a.value("lora_dropout", 0.0);
    lc.rslora = a.value("use_rslora", false);
    for (auto& t : a["target_modules"]) lc.targets.push_back(t.get<std::string>());
    if (a.contains("layers_to_transform") && a["layers_to_transform"].is_array())
      for (auto& l : a["layers_to_transform"]) lc.layers.push_back(l.get<int64_t>());
    slm::load_lora(*m, lc, slm::read_safetensors_files({adapter_dir + "/adapter_model.safetensors"}));
  }
  return m;
}

at::Tensor ids_tensor(const json& rows, at::ScalarType t) {
  int64_t B = rows.size(), T = rows[0].size();
  at::Tensor out = at::empty({B, T}, at::kLong);
  auto a = out.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++) a[b][i] = rows[b][i].get<int64_t>();
  return out.to(t);
}

// Logits [B, T, V] float32 on CPU from the model on its device.
at::Tensor forward(const slm::Qwen3Model& m, const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& mask) {
  at::NoGradGuard ng;
  auto dev = m.device();
  at::Tensor h = m.hidden(ids.to(dev), pos.to(dev), mask.to(dev), nullptr, slm::ForwardOptions{});
  return m.logits(h).to(at::kCPU, at::kFloat).contiguous();
}

std::vector<float> b64_floats(const std::string& s) {
  static int rev[256];
  static bool init = false;
  if (!init) {
    const char* al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int& r : rev) r = -1;
    for (int i = 0; i < 64; i++) rev[(unsigned char)al[i]] = i;
    init = true;
  }
  std::string bytes;
  int val = 0, bits = -8;
  for (unsigned char c : s) {
    if (rev[c] < 0) continue;
    val = (val << 6) + rev[c];
    bits += 6;
    if (bits >= 0) {
      bytes.push_back(char((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Device helpers.

bool is_cuda(const at::Device& d) { return d.is_cuda(); }

// Waits for the device's queued work: a blocking one-element copy to the host runs after everything
// queued before it on the (default) stream. Portable across libtorch 1.13 and 2.x (no CUDA headers).
void sync(const at::Device& d) {
  if (is_cuda(d)) (void)at::zeros({1}, at::TensorOptions().device(d)).to(at::kCPU);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Peak device memory (CUDA: the caching allocator's peak allocated bytes since the last reset; CPU:
// the process's peak resident set, VmHWM, which cannot be reset and so is an upper bound).
void reset_peak(const at::Device& d) {
#ifdef SLM_CHECK_CUDA
  if (is_cuda(d)) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index() < 0 ? 0 : d.index());
#else
  (void)d;
#endif
}
double peak_bytes(const at::Device& d) {
#ifdef SLM_CHECK_CUDA
  if (is_cuda(d)) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index() < 0 ? 0 : d.index());
    return (double)st.allocated_bytes[0].peak;  // StatType::AGGREGATE
  }
#endif
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return NAN;
}
double device_total_bytes(const at::Device& d) {
#ifdef SLM_CHECK_CUDA
  if (is_cuda(d)) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return (double)total_b;
  }
#endif
  (void)d;
  return NAN;
}

}  // namespace slm_check
