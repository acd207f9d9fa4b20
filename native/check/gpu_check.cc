// The GPU check (issue 35, item 1): slm_core's forward on a device named on the command line, with no
// Node.js, against
//   - the fixtures' reference logits (golden.json: float64 math over the stored weights), in float32
//     and in bfloat16 (each within its tolerance, below), every case of every model (adapter included);
//   - transformers' own forward on the same checkpoints, when scripts/gpu-check.sh could produce its
//     logits (--hf FILE: test/reference/hf_forward.py's output, one per model, float32).
// Prints a table, writes JSON (--json FILE) and exits 1 when a check fails (2 on a usage/setup error).
//
//   gpu_check --device cpu|cuda[:N] --fixtures DIR [--hf MODEL=FILE]... [--json FILE]
//
// Tolerances (max |logit - reference| over every non-padded position; the logits are O(1) here):
//   float32: 1e-4. The reference is float64; float32 rounding (2^-24 relative) through two layers and
//     a 512-wide head stays near 1e-6, so 1e-4 leaves room for a different summation order (cuBLAS,
//     TF32 is off by default for matmul in libtorch) and fails on any real error (a wrong RoPE, mask or
//     norm moves logits by 1e-2 and more).
//   bfloat16: 0.08, the engine tests' tolerance (test/engine-golden.test.ts, README "Engine"). bfloat16
//     keeps 8 significant bits (2^-9 = 0.002 relative per rounding); the activations round a few times
//     per layer and the errors add over the 2 layers and the head's 64-wide dot products: the addon
//     measured at most 0.03 on CPU against the same references, and 0.08 leaves room for a device's
//     different accumulation order while a real error (as above) still exceeds it. Argmax agreement is
//     reported, not required, in bfloat16 (near-ties flip legitimately).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/generate.h"
#include "core/lora.h"
#include "core/optimizer.h"
#include "core/qwen3.h"
#include "core/safetensors.h"
#include "core/train.h"

#ifdef SLM_CHECK_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

using json = nlohmann::json;

namespace {

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
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    const json& r = c["rope_scaling"];
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

at::Tensor ids_tensor(const json& rows, at::ScalarType t = at::kLong) {
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

struct Row {
  std::string check, model, dtype, kase, reference;
  double max_abs = 0, tol = 0;
  int64_t positions = 0, argmax_same = 0;
  bool argmax_required = true;
  bool pass = false;
  std::string note;
};

// Compares logits [B, T, V] with a reference where `use(b, t)`; fills max_abs, positions, argmax_same.
template <typename Ref, typename Use>
void compare(const at::Tensor& got, Ref ref, Use use, Row& r) {
  auto g = got.accessor<float, 3>();
  int64_t B = got.size(0), T = got.size(1), V = got.size(2);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      if (!use(b, t)) continue;
      r.positions++;
      int64_t ga = 0, ra = 0;
      double gbest = -INFINITY, rbest = -INFINITY;
      for (int64_t v = 0; v < V; v++) {
        double x = g[b][t][v], y = ref(b, t, v);
        r.max_abs = std::max(r.max_abs, std::fabs(x - y));
        if (x > gbest) gbest = x, ga = v;
        if (y > rbest) rbest = y, ra = v;
      }
      r.argmax_same += ga == ra;
    }
  r.pass = r.positions > 0 && r.max_abs <= r.tol && (!r.argmax_required || r.argmax_same == r.positions) && std::isfinite(r.max_abs);
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

// ---------------------------------------------------------------------------------------------------
// A LoRA step against PEFT + torch (test/reference/peft_step.py's output for the request beside it):
// the SFT loss, every adapter gradient, then one AdamW step, with the tolerances of test/real-model's
// checkLoraStep (loss 1e-4 relative; gradients 1e-3 of max |g|; after the step, where the gradient's
// sign is settled (|g| > 10x the largest gradient disagreement), within 2 % of lr).
void peft_rows(const std::string& ref_path, const std::string& device, std::vector<Row>& rows) {
  json ref = read_json(ref_path);
  json req = read_json(ref_path + ".request.json");
  std::string model_dir = req["model_dir"], adapter_dir = req["adapter_dir"];
  std::string mname = model_dir.substr(model_dir.find_last_of('/') + 1) + "+" + adapter_dir.substr(adapter_dir.find_last_of('/') + 1);
  auto model = load_model(model_dir, adapter_dir, at::kFloat, device);
  slm::TrainBatch b;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (auto& x : req["ids"]) ids.push_back(x.get<int32_t>());
  for (auto& x : req["mask"]) mask.push_back((uint8_t)x.get<int>());
  b.seqs = {ids};
  b.mask = {mask};
  slm::LossConfig lc;
  lc.kind = slm::LossKind::SFT;
  slm::OptimConfig oc;
  oc.lr = req["lr"].get<double>();
  oc.beta1 = req["betas"][0].get<double>();
  oc.beta2 = req["betas"][1].get<double>();
  oc.eps = req["eps"].get<double>();
  oc.weight_decay = req["weight_decay"].get<double>();
  oc.max_grad_norm = 0;
  slm::TrainOptions to;
  to.checkpoint = true;
  to.update = false;
  slm::AdamW opt;
  std::string ref_name = "PEFT " + ref.value("peft", std::string("?")) + " + torch " + ref.value("torch", std::string("?"));
  slm::TrainStats st = slm::train_step(*model, opt, b, lc, oc, to);
  {
    Row r{"lora-step", mname, "float32", "SFT loss", ref_name};
    r.tol = 1e-4 * std::max(1.0, std::fabs(ref["loss"].get<double>()));
    r.max_abs = std::fabs(st.loss - ref["loss"].get<double>());
    r.positions = 1;
    r.argmax_same = 1;
    r.pass = r.max_abs <= r.tol;
    r.note = "loss " + std::to_string(st.loss) + " vs " + std::to_string(ref["loss"].get<double>());
    rows.push_back(r);
  }
  auto params = slm::trainable(*model);
  double worst = 0, scale = 0;
  int64_t n = 0;
  std::map<std::string, std::vector<float>> refg;
  std::string missing;
  for (auto& [name, t] : params) {
    if (!ref["grads"].contains(name)) { missing += " " + name; continue; }
    refg[name] = b64_floats(ref["grads"][name].get<std::string>());
    at::Tensor g = t.grad().defined() ? t.grad().to(at::kCPU, at::kFloat).contiguous().view({-1}) : at::zeros({t.numel()});
    const std::vector<float>& rg = refg[name];
    if ((int64_t)rg.size() != g.numel()) { missing += " " + name + "(size)"; continue; }
    const float* gp = g.data_ptr<float>();
    for (int64_t i = 0; i < g.numel(); i++) {
      worst = std::max(worst, (double)std::fabs(gp[i] - rg[i]));
      scale = std::max(scale, (double)std::fabs(rg[i]));
    }
    n++;
  }
  {
    Row r{"lora-step", mname, "float32", "adapter gradients", ref_name};
    r.tol = 1e-3 * scale;
    r.max_abs = worst;
    r.positions = n;
    r.argmax_same = n;
    r.pass = missing.empty() && n == (int64_t)ref["grads"].size() && n > 0 && scale > 1e-6 && worst <= r.tol;
    r.note = std::to_string(n) + " tensors, max |g| " + std::to_string(scale) + (missing.empty() ? "" : "; missing or mis-sized:" + missing);
    rows.push_back(r);
  }
  slm::apply_gradients(*model, opt, oc, st);
  params = slm::trainable(*model);
  double off = 0;
  int64_t compared = 0, total = 0;
  for (auto& [name, t] : params) {
    if (!ref["after"].contains(name) || !refg.count(name)) continue;
    std::vector<float> ra = b64_floats(ref["after"][name].get<std::string>());
    at::Tensor p = t.detach().to(at::kCPU, at::kFloat).contiguous().view({-1});
    if ((int64_t)ra.size() != p.numel()) continue;
    const float* pp = p.data_ptr<float>();
    const std::vector<float>& rg = refg[name];
    for (int64_t i = 0; i < p.numel(); i++) {
      total++;
      if (std::fabs(rg[i]) <= 10 * worst) continue;
      compared++;
      off = std::max(off, (double)std::fabs(pp[i] - ra[i]));
    }
  }
  Row r{"lora-step", mname, "float32", "after one AdamW step", ref_name};
  r.tol = 0.02 * oc.lr;
  r.max_abs = off;
  r.positions = compared;
  r.argmax_same = compared;
  r.pass = compared > total / 2 && off <= r.tol;
  r.note = std::to_string(compared) + " of " + std::to_string(total) + " parameters with a settled step direction";
  rows.push_back(r);
}

// ---------------------------------------------------------------------------------------------------
// Greedy generation: the same prompts on the device and on CPU (float32) give the same tokens, and
// each row generated alone gives the tokens it got in the batch (padding, masks, shared prefixes and
// the finished-row compaction change nothing).
void generation_rows(const std::string& model_dir, const std::string& device, std::vector<Row>& rows) {
  auto dev_model = load_model(model_dir, "", at::kFloat, device);
  std::unique_ptr<slm::Qwen3Model> cpu_model = device == "cpu" ? nullptr : load_model(model_dir, "", at::kFloat, "cpu");
  std::string mname = model_dir.substr(model_dir.find_last_of('/') + 1);
  // Three rows: two share a 6-token prefix (the shared-prefix path), one is another length; row 1
  // stops early on a per-row limit so that the batch compacts while the others go on.
  std::vector<std::vector<int32_t>> prompts = {{204, 125, 373, 399, 458, 17, 300, 457, 205, 161},
                                               {204, 125, 373, 399, 458, 17, 12, 99},
                                               {12, 99, 300, 7, 45, 210, 3, 77, 41, 5, 6, 90, 91, 92}};
  std::vector<int64_t> limits = {32, 9, 32};
  auto run = [&](const slm::Qwen3Model& m, const std::vector<size_t>& which) {
    slm::GenerateParams p;
    for (size_t i : which) {
      p.prompts.push_back(prompts[i]);
      p.row_max_new_tokens.push_back(limits[i]);
      p.temperature.push_back(0.f);
    }
    p.max_new_tokens = 32;
    return slm::generate(m, p, nullptr).tokens;
  };
  auto batch = run(*dev_model, {0, 1, 2});
  auto same = [&](const std::string& kase, const std::string& reference, const std::vector<std::vector<int32_t>>& got,
                  const std::vector<std::vector<int32_t>>& want) {
    Row r{"generate", mname, "float32", kase, reference};
    r.tol = 0;
    int64_t first = -1;
    for (size_t b = 0; b < want.size(); b++)
      for (size_t i = 0; i < want[b].size(); i++) {
        r.positions++;
        bool eq = b < got.size() && i < got[b].size() && got[b][i] == want[b][i];
        r.argmax_same += eq;
        if (!eq && first < 0) first = (int64_t)r.positions - 1;
      }
    for (size_t b = 0; b < got.size() && b < want.size(); b++)
      if (got[b].size() != want[b].size()) r.note = "row " + std::to_string(b) + " has " + std::to_string(got[b].size()) + " tokens, expected " + std::to_string(want[b].size());
    r.max_abs = first < 0 ? 0 : 1;
    r.pass = r.positions > 0 && r.argmax_same == r.positions && r.note.empty() && got.size() == want.size();
    if (first >= 0 && r.note.empty()) r.note = "first different token at " + std::to_string(first);
    rows.push_back(r);
  };
  if (cpu_model) same("3 rows, device vs cpu", "the same batch on cpu", batch, run(*cpu_model, {0, 1, 2}));
  std::vector<std::vector<int32_t>> solo;
  for (size_t i = 0; i < prompts.size(); i++) solo.push_back(run(*dev_model, {i})[0]);
  same("batched rows vs solo", "each row generated alone on " + device, batch, solo);
}

// ---------------------------------------------------------------------------------------------------
// The benchmark (--bench 4b|tiny): a random model of Qwen3-4B's shape (36 layers, hidden 2560, MLP
// 9728, 32 query / 8 KV heads of 128, vocabulary 151,936, tied head) in bfloat16, or a small one for
// the CPU test. Every figure beside the device's limit measured in the same run: the copy bandwidth
// (a device-to-device copy, bytes read + written) bounds a decode step from below at batch 1 (every
// weight is read once per step), the bf16 matrix-product rate bounds prefill and the training step.
struct BenchShape {
  std::string name;
  int64_t layers, hidden, inter, heads, kv_heads, head_dim, vocab;
  int64_t prompt, new_tokens, prefill_short, prefill_long, train_seq, matmul_n, copy_mb;
  int64_t k, questions;  // decode batch = k * questions (each question's prompt repeated k times)
};
BenchShape bench_shape(const std::string& name) {
  if (name == "4b") return {"qwen3-4b-shaped", 36, 2560, 9728, 32, 8, 128, 151936, 512, 256, 512, 3000, 3000, 8192, 2048, 24, 2};
  if (name == "tiny") return {"tiny", 4, 256, 768, 4, 2, 64, 4096, 64, 32, 64, 256, 256, 512, 64, 4, 2};
  throw std::runtime_error("--bench takes 4b or tiny, not " + name);
}

json bench(const BenchShape& s, const std::string& device) {
  at::Device dev(device);
  at::NoGradGuard ng0;
  auto opts = at::TensorOptions().device(dev);
  json out = {{"shape", s.name}, {"device", device}, {"layers", s.layers}, {"hidden", s.hidden}, {"intermediate", s.inter}, {"vocab", s.vocab}};
  // Limits: copy bandwidth and the bf16 matmul rate (median of 5 after 2 warm-ups).
  auto median = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  {
    at::Tensor a = at::empty({s.copy_mb << 18}, opts.dtype(at::kFloat)).fill_(1), b = at::empty_like(a);
    std::vector<double> ts;
    for (int i = 0; i < 7; i++) {
      sync(dev);
      double t0 = now_s();
      b.copy_(a);
      sync(dev);
      if (i >= 2) ts.push_back(now_s() - t0);
    }
    out["copy_gb_s"] = 2.0 * a.numel() * 4 / median(ts) / 1e9;
  }
  {
    int64_t n = s.matmul_n;
    at::Tensor a = at::randn({n, n}, opts.dtype(at::kFloat)).to(at::kBFloat16), b = at::randn({n, n}, opts.dtype(at::kFloat)).to(at::kBFloat16);
    std::vector<double> ts;
    for (int i = 0; i < 7; i++) {
      sync(dev);
      double t0 = now_s();
      at::Tensor c = at::matmul(a, b);
      sync(dev);
      if (i >= 2) ts.push_back(now_s() - t0);
    }
    out["matmul_tflops"] = 2.0 * n * n * n / median(ts) / 1e12;
    out["matmul_n"] = n;
  }
  // The model: N(0, 0.02) weights made on the device, norms 1.
  slm::Qwen3Config cfg;
  cfg.vocab_size = s.vocab;
  cfg.hidden_size = s.hidden;
  cfg.intermediate_size = s.inter;
  cfg.num_hidden_layers = s.layers;
  cfg.num_attention_heads = s.heads;
  cfg.num_key_value_heads = s.kv_heads;
  cfg.head_dim = s.head_dim;
  cfg.tie_word_embeddings = true;
  slm::TensorMap w;
  at::manual_seed(0);
  auto rnd = [&](std::vector<int64_t> shape) { return (at::randn(shape, opts.dtype(at::kFloat)) * 0.02).to(at::kBFloat16); };
  auto one = [&](int64_t n) { return at::ones({n}, opts.dtype(at::kBFloat16)); };
  w.tensors["model.embed_tokens.weight"] = rnd({s.vocab, s.hidden});
  w.tensors["model.norm.weight"] = one(s.hidden);
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  for (int64_t l = 0; l < s.layers; l++) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    w.tensors[p + "self_attn.q_proj.weight"] = rnd({q, s.hidden});
    w.tensors[p + "self_attn.k_proj.weight"] = rnd({kv, s.hidden});
    w.tensors[p + "self_attn.v_proj.weight"] = rnd({kv, s.hidden});
    w.tensors[p + "self_attn.o_proj.weight"] = rnd({s.hidden, q});
    w.tensors[p + "self_attn.q_norm.weight"] = one(s.head_dim);
    w.tensors[p + "self_attn.k_norm.weight"] = one(s.head_dim);
    w.tensors[p + "mlp.gate_proj.weight"] = rnd({s.inter, s.hidden});
    w.tensors[p + "mlp.up_proj.weight"] = rnd({s.inter, s.hidden});
    w.tensors[p + "mlp.down_proj.weight"] = rnd({s.hidden, s.inter});
    w.tensors[p + "input_layernorm.weight"] = one(s.hidden);
    w.tensors[p + "post_attention_layernorm.weight"] = one(s.hidden);
  }
  slm::LoadOptions lo;
  lo.dtype = at::kBFloat16;
  lo.device = device;
  double t_load = now_s();
  slm::Qwen3Model m(cfg, std::move(w), lo);
  sync(dev);
  out["load_s"] = now_s() - t_load;
  out["parameters"] = m.num_parameters();
  out["parameter_bytes"] = m.parameter_bytes();
  out["device_total_bytes"] = device_total_bytes(dev);
  // Every weight is read once per decode step (the tied head as the vocabulary projection; the
  // embedding lookup reads a few rows): the floor of a batch-1 step is the weights' bytes at the copy's
  // rate (bytes read + written per second: a read-only stream is taken to be no faster).
  out["decode_floor_ms"] = (double)m.parameter_bytes() / (out["copy_gb_s"].get<double>() * 1e9) * 1e3;
  // Non-embedding parameters (the matmuls a token goes through), the head included once.
  const double P = (double)s.layers * (s.hidden * (q + 2 * kv) + q * s.hidden + 3.0 * s.hidden * s.inter) + (double)s.vocab * s.hidden;
  out["matmul_parameters"] = P;
  // Decode: batch 1, and batch k * questions (each question's prompt k times, as GRPO's rollouts),
  // temperature 1, every row runs new_tokens steps (no stop token).
  auto decode = [&](int64_t questions, int64_t k) {
    slm::GenerateParams p;
    for (int64_t qi = 0; qi < questions; qi++) {
      std::vector<int32_t> prompt;
      for (int64_t i = 0; i < s.prompt; i++) prompt.push_back((int32_t)(((qi * 131 + i) * 7919) % (s.vocab - 200) + 100));
      for (int64_t j = 0; j < k; j++) p.prompts.push_back(prompt);
    }
    p.max_new_tokens = s.new_tokens;
    p.temperature.assign(p.prompts.size(), 1.0f);
    p.seed = 1;
    slm::generate(m, p, nullptr);  // warm-up (allocator, kernels' autotuning)
    reset_peak(dev);
    sync(dev);
    slm::GenerateOutput o = slm::generate(m, p, nullptr);
    sync(dev);
    int64_t B = (int64_t)p.prompts.size(), toks = 0;
    for (auto& r : o.tokens) toks += (int64_t)r.size();
    return json{{"batch", B}, {"prompt", s.prompt}, {"new_tokens", s.new_tokens}, {"generated", toks}, {"steps", o.steps},
                {"prefill_s", o.prefill_seconds}, {"decode_s", o.decode_seconds},
                {"step_ms", o.decode_seconds / std::max<int64_t>(1, o.steps) * 1e3},
                {"tokens_per_s", toks / std::max(1e-9, o.prefill_seconds + o.decode_seconds)},
                {"row_latency_s", o.prefill_seconds + o.decode_seconds}, {"peak_bytes", peak_bytes(dev)}};
  };
  out["decode_b1"] = decode(1, 1);
  out["decode_batch"] = decode(s.questions, s.k);
  out["decode_batch"]["k"] = s.k;
  out["decode_batch"]["questions"] = s.questions;
  // Prefill: one row of T tokens, no cache, the last position's logits (median of 3 after a warm-up).
  auto prefill = [&](int64_t T) {
    at::Tensor ids = (at::arange(T, at::kLong) * 7919 % (s.vocab - 200) + 100).unsqueeze(0).to(dev);
    at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0).to(dev), mask = at::ones({1, T}, at::kLong).to(dev);
    std::vector<double> ts;
    reset_peak(dev);
    for (int i = 0; i < 4; i++) {
      sync(dev);
      double t0 = now_s();
      at::Tensor h = m.hidden(ids, pos, mask, nullptr, slm::ForwardOptions{});
      at::Tensor lg = m.logits(h.select(1, T - 1));
      sync(dev);
      if (i > 0) ts.push_back(now_s() - t0);
    }
    double t = median(ts);
    double flops = 2.0 * P * T + 4.0 * s.layers * q * (double)T * T / 2;  // matmuls + causal attention
    return json{{"tokens", T}, {"ms", t * 1e3}, {"tokens_per_s", T / t}, {"tflops", flops / t / 1e12}, {"peak_bytes", peak_bytes(dev)}};
  };
  out["prefill_short"] = prefill(s.prefill_short);
  out["prefill_long"] = prefill(s.prefill_long);
  // A LoRA step: r 16, alpha 32, q/k/v/o, per-layer checkpointing, one sequence of train_seq tokens
  // whose last 3/4 are trained, SFT loss, AdamW (median of 3 after a warm-up).
  {
    slm::LoraConfig lc;
    lc.r = 16;
    lc.alpha = 32;
    lc.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
    slm::attach_lora(m, lc, 7);
    slm::AdamW opt;
    slm::OptimConfig oc;
    oc.lr = 1e-5;
    oc.beta1 = 0.9;
    oc.beta2 = 0.999;
    oc.eps = 1e-8;
    oc.max_grad_norm = 1.0;
    slm::TrainBatch b;
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    for (int64_t i = 0; i < s.train_seq; i++) {
      ids.push_back((int32_t)((i * 7919) % (s.vocab - 200) + 100));
      mask.push_back(i >= s.train_seq / 4);
    }
    b.seqs = {ids};
    b.mask = {mask};
    slm::LossConfig lcfg;
    lcfg.kind = slm::LossKind::SFT;
    slm::TrainOptions to;
    to.checkpoint = true;
    std::vector<double> ts;
    double loss = 0;
    for (int i = 0; i < 4; i++) {
      if (i == 1) reset_peak(dev);
      at::GradMode::set_enabled(true);
      sync(dev);
      double t0 = now_s();
      slm::TrainStats st = slm::train_step(m, opt, b, lcfg, oc, to);
      sync(dev);
      if (i > 0) ts.push_back(now_s() - t0);
      loss = st.loss;
    }
    at::GradMode::set_enabled(false);
    double t = median(ts);
    // forward + recomputed forward + backward (input gradients only for the frozen weights) ~ 3 forwards.
    double flops = 3 * (2.0 * P * s.train_seq + 4.0 * s.layers * q * (double)s.train_seq * s.train_seq / 2);
    out["lora_step"] = {{"tokens", s.train_seq}, {"r", 16}, {"targets", "q,k,v,o"}, {"checkpoint", true}, {"ms", t * 1e3},
                        {"tflops", flops / t / 1e12}, {"peak_bytes", peak_bytes(dev)}, {"loss", loss}};
  }
  return out;
}

std::string gib(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return s;
}

void print_bench(const json& b, const json& peer) {
  auto pf = [&](const char* k, const char* f) -> std::string {
    if (peer.is_null() || !peer.contains(k) || !peer[k].contains(f) || !peer[k][f].is_number()) return "-";
    char s[32];
    std::snprintf(s, sizeof s, "%.1f", peer[k][f].get<double>());
    return s;
  };
  std::printf("\nbenchmark: %s model (%.3gB parameters, %s bfloat16) on %s; limits measured in this run: copy %.0f GB/s (read + write), "
              "bf16 matmul %.1f TFLOP/s (n = %lld)%s\n",
              b["shape"].get<std::string>().c_str(), b["parameters"].get<double>() / 1e9, gib(b["parameter_bytes"].get<double>()).c_str(),
              b["device"].get<std::string>().c_str(), b["copy_gb_s"].get<double>(), b["matmul_tflops"].get<double>(),
              (long long)b["matmul_n"].get<int64_t>(),
              std::isfinite(b["device_total_bytes"].get<double>()) ? (", device memory " + gib(b["device_total_bytes"].get<double>())).c_str() : "");
  std::string peer_name = peer.is_null() ? "(no peer)" : peer.value("name", std::string("peer"));
  std::printf("%-34s %12s %12s %14s %12s   %s\n", "measure", "slm-train", "limit", "vs limit", "peak mem", peer_name.c_str());
  const json& d1 = b["decode_b1"];
  const json& dk = b["decode_batch"];
  double floor = b["decode_floor_ms"].get<double>();
  std::printf("%-34s %9.2f ms %9.2f ms %13.2fx %12s   %s ms\n", "decode step, batch 1", d1["step_ms"].get<double>(), floor,
              d1["step_ms"].get<double>() / floor, gib(d1["peak_bytes"].get<double>()).c_str(), pf("decode_b1", "step_ms").c_str());
  char lbl[64];
  std::snprintf(lbl, sizeof lbl, "decode step, batch %lld (K=%lld x %lld)", (long long)dk["batch"].get<int64_t>(), (long long)dk["k"].get<int64_t>(),
                (long long)dk["questions"].get<int64_t>());
  std::printf("%-34s %9.2f ms %9.2f ms %13.2fx %12s   %s ms\n", lbl, dk["step_ms"].get<double>(), floor, dk["step_ms"].get<double>() / floor,
              gib(dk["peak_bytes"].get<double>()).c_str(), pf("decode_batch", "step_ms").c_str());
  std::snprintf(lbl, sizeof lbl, "rollout, batch %lld, %lld+%lld tok", (long long)dk["batch"].get<int64_t>(), (long long)dk["prompt"].get<int64_t>(),
                (long long)dk["new_tokens"].get<int64_t>());
  std::printf("%-34s %10.2f s %12s %14s %12s   %s s\n", lbl, dk["row_latency_s"].get<double>(), "", "", "", pf("decode_batch", "row_latency_s").c_str());
  std::printf("%-34s %8.0f tok/s %12s %14s %12s   %s tok/s\n", "  generated tokens per second", dk["tokens_per_s"].get<double>(), "", "", "",
              pf("decode_batch", "tokens_per_s").c_str());
  for (const char* k : {"prefill_short", "prefill_long"}) {
    const json& p = b[k];
    std::snprintf(lbl, sizeof lbl, "prefill %lld tokens", (long long)p["tokens"].get<int64_t>());
    std::printf("%-34s %9.1f ms %7.3g TF/s %13.0f%% %12s   %s ms\n", lbl, p["ms"].get<double>(), b["matmul_tflops"].get<double>(),
                100 * p["tflops"].get<double>() / b["matmul_tflops"].get<double>(), gib(p["peak_bytes"].get<double>()).c_str(), pf(k, "ms").c_str());
  }
  const json& l = b["lora_step"];
  std::snprintf(lbl, sizeof lbl, "LoRA step r16 qkvo ckpt, %lld tok", (long long)l["tokens"].get<int64_t>());
  std::printf("%-34s %9.1f ms %7.3g TF/s %13.0f%% %12s   %s ms, peak %s\n", lbl, l["ms"].get<double>(), b["matmul_tflops"].get<double>(),
              100 * l["tflops"].get<double>() / b["matmul_tflops"].get<double>(), gib(l["peak_bytes"].get<double>()).c_str(), pf("lora_step", "ms").c_str(),
              peer.is_null() || !peer.contains("lora_step") ? "-" : gib(peer["lora_step"].value("peak_bytes", NAN)).c_str());
  std::printf("(vs limit: a decode step's time over the time to read every weight once at the copy rate; prefill and the step: the model's "
              "matmul FLOP rate as a share of the bf16 matmul rate, the step counted as 3 forwards)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", fixtures, json_out, peft, bench_name, peer_path;
  bool gen = true;
  std::map<std::string, std::string> hf;  // model dir name -> hf_forward.py output
  std::vector<std::string> unchecked;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") device = next();
    else if (a == "--fixtures") fixtures = next();
    else if (a == "--json") json_out = next();
    else if (a == "--hf") {
      std::string v = next();
      auto eq = v.find('=');
      if (eq == std::string::npos) { std::cerr << "--hf MODEL=FILE\n"; return 2; }
      hf[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (a == "--unchecked") unchecked.push_back(next());
    else if (a == "--peft") peft = next();
    else if (a == "--bench") bench_name = next();
    else if (a == "--peer") peer_path = next();
    else if (a == "--no-generate") gen = false;
    else {
      std::cerr << "usage: gpu_check --device cpu|cuda[:N] --fixtures DIR [--hf MODEL=FILE]... [--peft FILE] [--no-generate] [--bench 4b|tiny [--peer FILE]]\n"
                   "                 [--unchecked TEXT]... [--json FILE]\n";
      return 2;
    }
  }
  if (fixtures.empty()) { std::cerr << "--fixtures DIR is required (the folder holding qwen3/golden.json)\n"; return 2; }
  json info = {{"torch", TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH}, {"device", device}};
  std::string torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH);
  info["torch"] = torch_version;
  info["cuda_available"] = at::globalContext().hasCUDA();
  std::cout << "gpu_check: libtorch " << torch_version << ", device " << device << ", CUDA " << (at::globalContext().hasCUDA() ? "available" : "not available")
            << "\n";
  if (device.rfind("cuda", 0) == 0 && !at::globalContext().hasCUDA()) {
    std::cerr << "gpu_check: device " << device << " asked, but this libtorch has no usable CUDA (a CPU build, or no GPU/driver)\n";
    return 2;
  }

  std::vector<Row> rows;
  auto t0 = std::chrono::steady_clock::now();
  json golden;
  try {
    golden = read_json(fixtures + "/qwen3/golden.json");
  } catch (const std::exception& e) {
    std::cerr << "gpu_check: " << e.what() << "\n";
    return 2;
  }
  struct Dt { const char* name; at::ScalarType t; double tol; bool argmax; };
  const Dt dtypes[] = {{"float32", at::kFloat, 1e-4, true}, {"bfloat16", at::kBFloat16, 0.08, false}};
  for (auto& [mname, m] : golden["models"].items()) {
    std::string mdir = fixtures + "/qwen3/" + m["model_dir"].get<std::string>();
    std::string adir = m["adapter_dir"].is_null() ? "" : fixtures + "/qwen3/" + m["adapter_dir"].get<std::string>();
    for (const Dt& dt : dtypes) {
      std::unique_ptr<slm::Qwen3Model> model;
      std::string err;
      try {
        model = load_model(mdir, adir, dt.t, device);
      } catch (const std::exception& e) {
        err = e.what();
      }
      for (auto& c : m["cases"]) {
        Row r{"golden", mname, dt.name, c["name"].get<std::string>(), "golden.json (float64)"};
        r.tol = dt.tol;
        r.argmax_required = dt.argmax;
        if (!model) { r.note = "load failed: " + err; rows.push_back(r); continue; }
        try {
          at::Tensor got = forward(*model, ids_tensor(c["input_ids"]), ids_tensor(c["position_ids"]), ids_tensor(c["attention_mask"]));
          const json& L = c["logits"];
          compare(got, [&](int64_t b, int64_t t, int64_t v) { return L[b][t][v].get<double>(); },
                  [&](int64_t b, int64_t t) { return !L[b][t].is_null(); }, r);
        } catch (const std::exception& e) {
          r.note = e.what();
          r.pass = false;
        }
        rows.push_back(r);
      }
      // transformers' forward on the same checkpoint (float32 reference; unpadded rows, positions 0..T-1).
      auto h = hf.find(m["model_dir"].get<std::string>());
      if (h != hf.end() && adir.empty() && model) {
        json ref = read_json(h->second);
        const json& req = read_json(h->second + ".request.json");
        int64_t V = ref["vocab"].get<int64_t>();
        for (size_t i = 0; i < req["rows"].size(); i++) {
          Row r{"transformers", mname, dt.name, "row" + std::to_string(i) + " (T=" + std::to_string(req["rows"][i].size()) + ")",
                "transformers " + ref.value("transformers", std::string("?")) + " " + ref.value("dtype", std::string("float32"))};
          r.tol = dt.tol;
          r.argmax_required = dt.argmax;
          try {
            json one = json::array({req["rows"][i]});
            int64_t T = req["rows"][i].size();
            at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0);
            at::Tensor got = forward(*model, ids_tensor(one), pos, at::ones({1, T}, at::kLong));
            std::vector<float> lf = b64_floats(ref["logits"][i].get<std::string>());
            if ((int64_t)lf.size() != T * V) throw std::runtime_error("reference logits have the wrong size");
            compare(got, [&](int64_t, int64_t t, int64_t v) { return (double)lf[t * V + v]; }, [](int64_t, int64_t) { return true; }, r);
          } catch (const std::exception& e) {
            r.note = e.what();
            r.pass = false;
          }
          rows.push_back(r);
        }
      }
    }
  }
  // The LoRA step against PEFT, greedy generation, then the benchmark.
  if (!peft.empty()) {
    try {
      peft_rows(peft, device, rows);
    } catch (const std::exception& e) {
      Row r{"lora-step", "?", "float32", "step", "PEFT"};
      r.note = e.what();
      rows.push_back(r);
    }
  }
  if (gen) {
    try {
      generation_rows(fixtures + "/qwen3/tiny-qwen3-f32", device, rows);
    } catch (const std::exception& e) {
      Row r{"generate", "tiny-qwen3-f32", "float32", "greedy", "cpu / solo"};
      r.note = e.what();
      rows.push_back(r);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The table, and the JSON without the benchmark (written again with it below: a benchmark that
  // dies, out of memory say, leaves the checks' results behind).
  int failed = 0;
  std::printf("\n%-13s %-25s %-9s %-28s %9s %9s %9s  %s\n", "check", "model", "dtype", "case", "positions", "argmax=", "max|d|", "tol / result");
  for (const Row& r : rows) {
    if (!r.pass) failed++;
    char am[32];
    std::snprintf(am, sizeof am, "%lld/%lld", (long long)r.argmax_same, (long long)r.positions);
    std::printf("%-13s %-25s %-9s %-28s %9lld %9s %9.2e  %.0e %s%s%s\n", r.check.c_str(), r.model.c_str(), r.dtype.c_str(), r.kase.c_str(),
                (long long)r.positions, am, r.max_abs, r.tol, r.pass ? "PASS" : "FAIL", r.note.empty() ? "" : ": ", r.note.c_str());
  }
  std::printf("\n%zu checks, %d failed, %.1f s on %s (libtorch %s)\n", rows.size(), failed, secs, device.c_str(), torch_version.c_str());
  if (hf.empty() && unchecked.empty()) unchecked.push_back("transformers' forward (no --hf reference given)");
  if (peft.empty()) unchecked.push_back("the LoRA training step against PEFT + torch (no --peft reference given)");
  if (!gen) unchecked.push_back("greedy generation (--no-generate)");
  if (bench_name.empty()) unchecked.push_back("the benchmark (no --bench)");
  std::fflush(stdout);
  json j = info;
  j["seconds"] = secs;
  j["failed"] = failed;
  j["checks"] = json::array();
  for (const Row& r : rows)
    j["checks"].push_back({{"check", r.check}, {"model", r.model}, {"dtype", r.dtype}, {"case", r.kase}, {"reference", r.reference},
                           {"positions", r.positions}, {"argmax_same", r.argmax_same}, {"argmax_required", r.argmax_required},
                           {"max_abs", r.max_abs}, {"tol", r.tol}, {"pass", r.pass}, {"note", r.note}});
  auto write_json = [&]() {
    if (json_out.empty()) return;
    j["not_checked"] = unchecked;
    std::ofstream(json_out) << j.dump(1) << "\n";
  };
  write_json();

  std::string bench_error;
  if (!bench_name.empty()) {
    json peer;
    if (!peer_path.empty()) {
      try {
        peer = read_json(peer_path);
        j["peer"] = peer;
      } catch (const std::exception& e) {
        unchecked.push_back(std::string("the peer's benchmark (") + e.what() + ")");
      }
    }
    try {
      j["bench"] = bench(bench_shape(bench_name), device);
      print_bench(j["bench"], peer);
    } catch (const std::exception& e) {
      bench_error = e.what();
      j["bench_error"] = bench_error;
      std::printf("\nbenchmark FAILED: %s\n", bench_error.c_str());
    }
  }
  for (const std::string& u : unchecked) std::printf("not checked: %s\n", u.c_str());
  write_json();
  return failed || rows.empty() || !bench_error.empty() ? 1 : 0;
}
