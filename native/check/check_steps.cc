// The GPU check's LoRA step against PEFT + torch and its generation checks (check.h).
#include "check.h"

#include "core/forward.h"
#include "core/continuous.h"
#include "core/generate.h"
#include "core/lora.h"
#include "core/optimizer.h"
#include "core/train.h"

namespace slm_check {

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
    if (!ref["grads"].contains(name)) {
      missing += " " + name;
      continue;
    }
    refg[name] = b64_floats(ref["grads"][name].get<std::string>());
    at::Tensor g = t.grad().defined() ? t.grad().to(at::kCPU, at::kFloat).contiguous().view({-1}) : at::zeros({t.numel()});
    const std::vector<float>& rg = refg[name];
    if ((int64_t)rg.size() != g.numel()) {
      missing += " " + name + "(size)";
      continue;
    }
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
    r.note =
        std::to_string(n) + " tensors, max |g| " + std::to_string(scale) + (missing.empty() ? "" : "; missing or mis-sized:" + missing);
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
  auto same = [&](const std::string& check, const std::string& kase, const std::string& reference,
                  const std::vector<std::vector<int32_t>>& got, const std::vector<std::vector<int32_t>>& want) {
    Row r{check, mname, "float32", kase, reference};
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
      if (got[b].size() != want[b].size())
        r.note =
            "row " + std::to_string(b) + " has " + std::to_string(got[b].size()) + " tokens, expected " + std::to_string(want[b].size());
    r.max_abs = first < 0 ? 0 : 1;
    r.pass = r.positions > 0 && r.argmax_same == r.positions && r.note.empty() && got.size() == want.size();
    if (first >= 0 && r.note.empty()) r.note = "first different token at " + std::to_string(first);
    rows.push_back(r);
  };
  if (cpu_model) same("generate", "3 rows, device vs cpu", "the same batch on cpu", batch, run(*cpu_model, {0, 1, 2}));
  std::vector<std::vector<int32_t>> solo;
  for (size_t i = 0; i < prompts.size(); i++) solo.push_back(run(*dev_model, {i})[0]);
  same("generate", "batched rows vs solo", "each row generated alone on " + device, batch, solo);
  // Continuous batching (the serve path): row 0 decodes alone; rows 1 and 2 join from its token
  // callback after its 5th token, their prompts prefilled 4 positions per iteration between decode
  // steps, then merged into the running batch's cache. Each row's tokens are those it got alone.
  {
    slm::SessionParams sp;
    sp.prefill_chunk = 4;
    sp.max_rows = 8;
    std::vector<std::vector<int32_t>> got(prompts.size());
    auto req = [&](size_t i) {
      slm::RowRequest r;
      r.prompt = prompts[i];
      r.max_new_tokens = limits[i];
      r.temperature = 0.f;
      return r;
    };
    std::string err;
    try {
      slm::ContinuousBatch cb(*dev_model, sp, nullptr);
      bool joined = false;
      cb.set_on_step([&](slm::StepEvent&& ev) {
        for (size_t j = 0; j < ev.rows.size(); j++)
          if (ev.tokens[j] >= 0 && ev.rows[j] >= 0 && (size_t)ev.rows[j] < got.size()) got[ev.rows[j]].push_back(ev.tokens[j]);
        if (!joined && got[0].size() >= 5) {
          joined = true;
          cb.submit({req(1), req(2)});
        }
      });
      cb.submit({req(0)});
      slm::SessionStats st = cb.run();
      if (st.joined < 2) err = "rows 1 and 2 did not join a running decode (joined " + std::to_string(st.joined) + ")";
    } catch (const std::exception& e) {
      err = e.what();
    }
    same("continuous", "rows joining a running decode vs solo", "each row generated alone on " + device, got, solo);
    if (!err.empty()) rows.back().pass = false, rows.back().note = err;
  }
}

// transformers' forward (test/reference/hf_forward.py's output `ref_path`, its request beside it as
// ref_path.request.json) against the model's, row by row: unpadded rows, positions 0..T-1.
void hf_rows(const slm::Qwen3Model& model, const std::string& mname, const std::string& dtype, double tol, bool argmax,
             const std::string& ref_path, std::vector<Row>& rows) {
  json ref = read_json(ref_path);
  const json req = read_json(ref_path + ".request.json");
  int64_t V = ref["vocab"].get<int64_t>();
  for (size_t i = 0; i < req["rows"].size(); i++) {
    Row r{"transformers", mname, dtype, "row" + std::to_string(i) + " (T=" + std::to_string(req["rows"][i].size()) + ")",
          "transformers " + ref.value("transformers", std::string("?")) + " " + ref.value("dtype", std::string("float32"))};
    r.tol = tol;
    r.argmax_required = argmax;
    try {
      json one = json::array({req["rows"][i]});
      int64_t T = req["rows"][i].size();
      at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0);
      at::Tensor got = forward(model, ids_tensor(one), pos, at::ones({1, T}, at::kLong));
      std::vector<float> lf = b64_floats(ref["logits"][i].get<std::string>());
      if ((int64_t)lf.size() != T * V) throw std::runtime_error("reference logits have the wrong size");
      compare(
          got, [&](int64_t, int64_t t, int64_t v) { return (double)lf[t * V + v]; }, [](int64_t, int64_t) { return true; }, r);
    } catch (const std::exception& e) {
      r.note = e.what();
      r.pass = false;
    }
    rows.push_back(r);
  }
}

}  // namespace slm_check
