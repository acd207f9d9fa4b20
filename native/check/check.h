// Shared by the GPU check's files (native/check/): reading the fixtures, the model loader, the result
// row and its comparison, device helpers, and the checks and benchmark gpu_check.cc runs.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Context.h>
#include <c10/core/Device.h>

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

#include "core/qwen3.h"

namespace slm_check {

using json = nlohmann::json;

json read_json(const std::string& path);
bool exists(const std::string& path);
// config.json -> the core's config (what lib/model/config.ts passes for qwen3 / qwen2 / llama).
slm::Qwen3Config read_config(const json& c);
std::unique_ptr<slm::Qwen3Model> load_model(const std::string& dir, const std::string& adapter_dir, at::ScalarType dtype,
                                            const std::string& device);
at::Tensor ids_tensor(const json& rows, at::ScalarType t = at::kLong);
// Logits [B, T, V] float32 on CPU from the model on its device.
at::Tensor forward(const slm::Qwen3Model& m, const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& mask);
std::vector<float> b64_floats(const std::string& s);

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

// Device helpers (check_common.cc): wait for the device's queued work, a monotonic clock, peak memory.
void sync(const at::Device& d);
double now_s();
void reset_peak(const at::Device& d);
double peak_bytes(const at::Device& d);
double device_total_bytes(const at::Device& d);

// check_steps.cc: the LoRA step against PEFT + torch, greedy generation device vs CPU and batched vs solo.
void peft_rows(const std::string& ref_path, const std::string& device, std::vector<Row>& rows);
void generation_rows(const std::string& model_dir, const std::string& device, std::vector<Row>& rows);
// transformers' forward (hf_forward.py's output at ref_path) against the model's, one Row per row.
void hf_rows(const slm::Qwen3Model& model, const std::string& mname, const std::string& dtype, double tol, bool argmax,
             const std::string& ref_path, std::vector<Row>& rows);

// check_bench.cc: the benchmark (--bench 4b|tiny) and its table.
struct BenchShape {
  std::string name;
  int64_t layers, hidden, inter, heads, kv_heads, head_dim, vocab;
  int64_t prompt, new_tokens, prefill_short, prefill_long, train_seq, matmul_n, copy_mb;
  int64_t k, questions;  // decode batch = k * questions (each question's prompt repeated k times)
};
BenchShape bench_shape(const std::string& name);
json bench(const BenchShape& s, const std::string& device);
void print_bench(const json& b, const json& peer);

}  // namespace slm_check
