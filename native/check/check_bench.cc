// The GPU check's benchmark (check.h): a random Qwen3-4B-shaped (or tiny) bfloat16 model beside the
// device's limits measured in the same run.
#include "check.h"

#include "core/continuous.h"
#include "core/forward.h"
#include "core/generate.h"
#include "core/lora.h"
#include "core/optimizer.h"
#include "core/train.h"

namespace slm_check {

// ---------------------------------------------------------------------------------------------------
// The benchmark (--bench 4b|tiny): a random model of Qwen3-4B's shape (36 layers, hidden 2560, MLP
// 9728, 32 query / 8 KV heads of 128, vocabulary 151,936, tied head) in bfloat16, or a small one for
// the CPU test. Every figure beside the device's limit measured in the same run: the copy bandwidth
// (a device-to-device copy, bytes read + written) bounds a decode step from below at batch 1 (every
// weight is read once per step), the bf16 matrix-product rate bounds prefill and the training step.
BenchShape bench_shape(const std::string& name) {
  if (name == "4b") return {"qwen3-4b-shaped", 36, 2560, 9728, 32, 8, 128, 151936, 512, 256, 512, 3000, 3000, 8192, 2048, 24, 2};
  if (name == "tiny") return {"tiny", 4, 256, 768, 4, 2, 64, 4096, 64, 32, 64, 256, 256, 512, 64, 4, 2};
  throw std::runtime_error("--bench takes 4b or tiny, not " + name);
}

json bench(const BenchShape& s, const std::string& device) {
  at::Device dev(device);
  at::NoGradGuard ng0;
  auto opts = at::TensorOptions().device(dev);
  json out = {{"shape", s.name},    {"device", device},        {"layers", s.layers},
              {"hidden", s.hidden}, {"intermediate", s.inter}, {"vocab", s.vocab}};
  // Limits: copy bandwidth and the bf16 matmul rate (median of 5 after 2 warm-ups).
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
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
    at::Tensor a = at::randn({n, n}, opts.dtype(at::kFloat)).to(at::kBFloat16),
               b = at::randn({n, n}, opts.dtype(at::kFloat)).to(at::kBFloat16);
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
  // Question qi's prompt: s.prompt token ids spread over the vocabulary (the decode and session rows share them).
  auto question_prompt = [&](int64_t qi) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < s.prompt; i++) prompt.push_back((int32_t)(((qi * 131 + i) * 7919) % (s.vocab - 200) + 100));
    return prompt;
  };
  // Decode: batch 1, and batch k * questions (each question's prompt k times, as GRPO's rollouts),
  // temperature 1, every row runs new_tokens steps (no stop token).
  auto decode = [&](int64_t questions, int64_t k) {
    slm::GenerateParams p;
    for (int64_t qi = 0; qi < questions; qi++) {
      const std::vector<int32_t> prompt = question_prompt(qi);
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
    return json{{"batch", B},
                {"prompt", s.prompt},
                {"new_tokens", s.new_tokens},
                {"generated", toks},
                {"steps", o.steps},
                {"prefill_s", o.prefill_seconds},
                {"decode_s", o.decode_seconds},
                {"step_ms", o.decode_seconds / std::max<int64_t>(1, o.steps) * 1e3},
                {"tokens_per_s", toks / std::max(1e-9, o.prefill_seconds + o.decode_seconds)},
                {"row_latency_s", o.prefill_seconds + o.decode_seconds},
                {"peak_bytes", peak_bytes(dev)}};
  };
  out["decode_b1"] = decode(1, 1);
  out["decode_batch"] = decode(s.questions, s.k);
  out["decode_batch"]["k"] = s.k;
  out["decode_batch"]["questions"] = s.questions;
  // The same rows through a continuous-batching session (the serve path): all submitted at once, and
  // arriving in waves (a wave of batch/6 rows, the next after every 8 decode steps), each prompt
  // prefilled 256 positions per iteration between decode steps.
  auto session = [&](int64_t waves) {
    std::vector<slm::RowRequest> reqs;
    for (int64_t qi = 0; qi < s.questions; qi++) {
      const std::vector<int32_t> prompt = question_prompt(qi);
      for (int64_t j = 0; j < s.k; j++) {
        slm::RowRequest r;
        r.prompt = prompt;
        r.max_new_tokens = s.new_tokens;
        r.temperature = 1.f;
        r.seed = (uint64_t)(qi * s.k + j + 1);
        reqs.push_back(std::move(r));
      }
    }
    const int64_t B = (int64_t)reqs.size(), per = (B + waves - 1) / waves;
    slm::SessionParams sp;
    sp.max_rows = B;
    sp.prefill_chunk = 256;
    slm::ContinuousBatch cb(m, sp, nullptr);
    int64_t next = 0, toks = 0, events = 0;
    auto wave = [&]() {
      std::vector<slm::RowRequest> w;
      for (int64_t i = 0; i < per && next < B; i++) w.push_back(reqs[next++]);
      if (!w.empty()) cb.submit(std::move(w));
    };
    cb.set_on_step([&](slm::StepEvent&& ev) {
      for (int32_t t : ev.tokens) toks += t >= 0;
      if (++events % 8 == 0) wave();
    });
    reset_peak(dev);
    sync(dev);
    double t0 = now_s();
    wave();
    slm::SessionStats st = cb.run();
    sync(dev);
    double wall = now_s() - t0;
    return json{{"batch", B},
                {"waves", (B + per - 1) / per},
                {"generated", toks},
                {"wall_s", wall},
                {"steps", st.steps},
                {"joined", st.joined},
                {"max_batch", st.max_batch},
                {"rebuilds", st.rebuilds},
                {"prefill_s", st.prefill_seconds},
                {"decode_s", st.decode_seconds},
                {"tokens_per_s", toks / std::max(1e-9, wall)},
                {"peak_bytes", peak_bytes(dev)}};
  };
  out["session_at_once"] = session(1);
  out["session_waves"] = session(6);
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
    out["lora_step"] = {{"tokens", s.train_seq},
                        {"r", 16},
                        {"targets", "q,k,v,o"},
                        {"checkpoint", true},
                        {"ms", t * 1e3},
                        {"tflops", flops / t / 1e12},
                        {"peak_bytes", peak_bytes(dev)},
                        {"loss", loss}};
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
  std::printf(
      "\nbenchmark: %s model (%.3gB parameters, %s bfloat16) on %s; limits measured in this run: copy %.0f GB/s (read + write), "
      "bf16 matmul %.1f TFLOP/s (n = %lld)%s\n",
      b["shape"].get<std::string>().c_str(), b["parameters"].get<double>() / 1e9, gib(b["parameter_bytes"].get<double>()).c_str(),
      b["device"].get<std::string>().c_str(), b["copy_gb_s"].get<double>(), b["matmul_tflops"].get<double>(),
      (long long)b["matmul_n"].get<int64_t>(),
      std::isfinite(b["device_total_bytes"].get<double>()) ? (", device memory " + gib(b["device_total_bytes"].get<double>())).c_str()
                                                           : "");
  std::string peer_name = peer.is_null() ? "(no peer)" : peer.value("name", std::string("peer"));
  std::printf("%-34s %12s %12s %14s %12s   %s\n", "measure", "slm-train", "limit", "vs limit", "peak mem", peer_name.c_str());
  const json& d1 = b["decode_b1"];
  const json& dk = b["decode_batch"];
  double floor = b["decode_floor_ms"].get<double>();
  std::printf("%-34s %9.2f ms %9.2f ms %13.2fx %12s   %s ms\n", "decode step, batch 1", d1["step_ms"].get<double>(), floor,
              d1["step_ms"].get<double>() / floor, gib(d1["peak_bytes"].get<double>()).c_str(), pf("decode_b1", "step_ms").c_str());
  char lbl[64];
  std::snprintf(lbl, sizeof lbl, "decode step, batch %lld (K=%lld x %lld)", (long long)dk["batch"].get<int64_t>(),
                (long long)dk["k"].get<int64_t>(), (long long)dk["questions"].get<int64_t>());
  std::printf("%-34s %9.2f ms %9.2f ms %13.2fx %12s   %s ms\n", lbl, dk["step_ms"].get<double>(), floor,
              dk["step_ms"].get<double>() / floor, gib(dk["peak_bytes"].get<double>()).c_str(), pf("decode_batch", "step_ms").c_str());
  std::snprintf(lbl, sizeof lbl, "rollout, batch %lld, %lld+%lld tok", (long long)dk["batch"].get<int64_t>(),
                (long long)dk["prompt"].get<int64_t>(), (long long)dk["new_tokens"].get<int64_t>());
  std::printf("%-34s %10.2f s %12s %14s %12s   %s s\n", lbl, dk["row_latency_s"].get<double>(), "", "", "",
              pf("decode_batch", "row_latency_s").c_str());
  std::printf("%-34s %8.0f tok/s %12s %14s %12s   %s tok/s\n", "  generated tokens per second", dk["tokens_per_s"].get<double>(), "", "",
              "", pf("decode_batch", "tokens_per_s").c_str());
  for (const char* k : {"session_at_once", "session_waves"}) {
    if (!b.contains(k)) continue;
    const json& c = b[k];
    std::snprintf(lbl, sizeof lbl, "session, %lld rows in %lld wave%s", (long long)c["batch"].get<int64_t>(),
                  (long long)c["waves"].get<int64_t>(), c["waves"].get<int64_t>() > 1 ? "s" : "");
    std::printf("%-34s %8.0f tok/s %12s %13.2fx %12s   (of generate's tok/s; %lld joined, %lld steps)\n", lbl,
                c["tokens_per_s"].get<double>(), "", c["tokens_per_s"].get<double>() / dk["tokens_per_s"].get<double>(),
                gib(c["peak_bytes"].get<double>()).c_str(), (long long)c["joined"].get<int64_t>(), (long long)c["steps"].get<int64_t>());
  }
  for (const char* k : {"prefill_short", "prefill_long"}) {
    const json& p = b[k];
    std::snprintf(lbl, sizeof lbl, "prefill %lld tokens", (long long)p["tokens"].get<int64_t>());
    std::printf("%-34s %9.1f ms %7.3g TF/s %13.0f%% %12s   %s ms\n", lbl, p["ms"].get<double>(), b["matmul_tflops"].get<double>(),
                100 * p["tflops"].get<double>() / b["matmul_tflops"].get<double>(), gib(p["peak_bytes"].get<double>()).c_str(),
                pf(k, "ms").c_str());
  }
  const json& l = b["lora_step"];
  std::snprintf(lbl, sizeof lbl, "LoRA step r16 qkvo ckpt, %lld tok", (long long)l["tokens"].get<int64_t>());
  std::printf("%-34s %9.1f ms %7.3g TF/s %13.0f%% %12s   %s ms, peak %s\n", lbl, l["ms"].get<double>(), b["matmul_tflops"].get<double>(),
              100 * l["tflops"].get<double>() / b["matmul_tflops"].get<double>(), gib(l["peak_bytes"].get<double>()).c_str(),
              pf("lora_step", "ms").c_str(),
              peer.is_null() || !peer.contains("lora_step") ? "-" : gib(peer["lora_step"].value("peak_bytes", NAN)).c_str());
  std::printf(
      "(vs limit: a decode step's time over the time to read every weight once at the copy rate; prefill and the step: the model's "
      "matmul FLOP rate as a share of the bf16 matmul rate, the step counted as 3 forwards)\n");
}

}  // namespace slm_check
