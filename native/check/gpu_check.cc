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
#include <torch/version.h>

#include "check.h"

using namespace slm_check;

int main(int argc, char** argv) {
  std::string device = "cpu", fixtures, json_out, peft, bench_name, peer_path;
  bool gen = true;
  std::map<std::string, std::string> hf;  // model dir name -> hf_forward.py output
  std::vector<std::string> hf_extra;      // hf_forward.py outputs for checkpoints outside the fixtures
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
    if (a == "--device")
      device = next();
    else if (a == "--fixtures")
      fixtures = next();
    else if (a == "--json")
      json_out = next();
    else if (a == "--hf") {
      std::string v = next();
      auto eq = v.find('=');
      if (eq == std::string::npos) {
        std::cerr << "--hf MODEL=FILE\n";
        return 2;
      }
      hf[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (a == "--unchecked")
      unchecked.push_back(next());
    else if (a == "--hf-extra")
      hf_extra.push_back(next());
    else if (a == "--peft")
      peft = next();
    else if (a == "--bench")
      bench_name = next();
    else if (a == "--peer")
      peer_path = next();
    else if (a == "--no-generate")
      gen = false;
    else {
      std::cerr << "usage: gpu_check --device cpu|cuda[:N] --fixtures DIR [--hf MODEL=FILE]... [--hf-extra FILE]... [--peft FILE] "
                   "[--no-generate] [--bench 4b|tiny [--peer FILE]]\n"
                   "                 [--unchecked TEXT]... [--json FILE]\n";
      return 2;
    }
  }
  if (fixtures.empty()) {
    std::cerr << "--fixtures DIR is required (the folder holding qwen3/golden.json)\n";
    return 2;
  }
  json info = {{"torch", TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH}, {"device", device}};
  std::string torch_version =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH);
  info["torch"] = torch_version;
  info["cuda_available"] = at::globalContext().hasCUDA();
  std::cout << "gpu_check: libtorch " << torch_version << ", device " << device << ", CUDA "
            << (at::globalContext().hasCUDA() ? "available" : "not available") << "\n";
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
  struct Dt {
    const char* name;
    at::ScalarType t;
    double tol;
    bool argmax;
  };
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
        if (!model) {
          r.note = "load failed: " + err;
          rows.push_back(r);
          continue;
        }
        try {
          at::Tensor got = forward(*model, ids_tensor(c["input_ids"]), ids_tensor(c["position_ids"]), ids_tensor(c["attention_mask"]));
          const json& L = c["logits"];
          compare(
              got, [&](int64_t b, int64_t t, int64_t v) { return L[b][t][v].get<double>(); },
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
        hf_rows(*model, mname, dt.name, dt.tol, dt.argmax, h->second, rows);
      }
    }
  }
  // Other architectures (Qwen2, Llama with llama3 RoPE scaling): random checkpoints that
  // scripts/gpu-check.sh wrote with transformers, against transformers' forward on them.
  for (const std::string& ref_path : hf_extra) {
    std::string model_dir, mname;
    try {
      model_dir = read_json(ref_path + ".request.json")["model_dir"].get<std::string>();
      mname = model_dir.substr(model_dir.find_last_of('/') + 1);
    } catch (const std::exception& e) {
      Row r{"transformers", ref_path, "-", "request", "transformers"};
      r.note = e.what();
      rows.push_back(r);
      continue;
    }
    for (const Dt& dt : dtypes) {
      try {
        auto model = load_model(model_dir, "", dt.t, device);
        hf_rows(*model, mname, dt.name, dt.tol, dt.argmax, ref_path, rows);
      } catch (const std::exception& e) {
        Row r{"transformers", mname, dt.name, "load", "transformers"};
        r.note = e.what();
        rows.push_back(r);
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
  std::printf("\n%-13s %-25s %-9s %-28s %9s %9s %9s  %s\n", "check", "model", "dtype", "case", "positions", "argmax=", "max|d|",
              "tol / result");
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
    j["checks"].push_back({{"check", r.check},
                           {"model", r.model},
                           {"dtype", r.dtype},
                           {"case", r.kase},
                           {"reference", r.reference},
                           {"positions", r.positions},
                           {"argmax_same", r.argmax_same},
                           {"argmax_required", r.argmax_required},
                           {"max_abs", r.max_abs},
                           {"tol", r.tol},
                           {"pass", r.pass},
                           {"note", r.note}});
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
