#include "addon/model.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/safetensors.h"

namespace slm_addon {

namespace {

slm::Qwen3Config read_config(Napi::Env env, const Napi::Object& c) {
  slm::Qwen3Config cfg;
  cfg.vocab_size = int_field(env, c, "vocab_size", 0, true);
  cfg.hidden_size = int_field(env, c, "hidden_size", 0, true);
  cfg.intermediate_size = int_field(env, c, "intermediate_size", 0, true);
  cfg.num_hidden_layers = int_field(env, c, "num_hidden_layers", 0, true);
  cfg.num_attention_heads = int_field(env, c, "num_attention_heads", 0, true);
  cfg.num_key_value_heads = int_field(env, c, "num_key_value_heads", cfg.num_attention_heads);
  cfg.head_dim = int_field(env, c, "head_dim", cfg.hidden_size / std::max<int64_t>(cfg.num_attention_heads, 1));
  cfg.rope_theta = num_field(env, c, "rope_theta", 1e6);
  cfg.rms_norm_eps = num_field(env, c, "rms_norm_eps", 1e-6);
  auto tie = c.Get("tie_word_embeddings");
  cfg.tie_word_embeddings = tie.IsBoolean() && tie.As<Napi::Boolean>().Value();
  // The architecture's switches and RoPE scaling, as lib/model/config.ts derives them from config.json.
  auto flag = [&](const char* k, bool dflt) {
    auto v = c.Get(k);
    return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : dflt;
  };
  cfg.arch.model_type = str_field(env, c, "model_type", "qwen3");
  cfg.arch.qk_norm = flag("qk_norm", true);
  cfg.arch.qkv_bias = flag("qkv_bias", false);
  cfg.arch.o_bias = flag("o_bias", false);
  cfg.arch.mlp_bias = flag("mlp_bias", false);
  cfg.rope_scaling.type = str_field(env, c, "rope_type", "default");
  cfg.rope_scaling.factor = num_field(env, c, "rope_factor", 1.0);
  cfg.rope_scaling.low_freq_factor = num_field(env, c, "rope_low_freq_factor", 1.0);
  cfg.rope_scaling.high_freq_factor = num_field(env, c, "rope_high_freq_factor", 4.0);
  cfg.rope_scaling.original_max_position_embeddings = num_field(env, c, "rope_original_max_position_embeddings", 8192);
  return cfg;
}

class LoadWorker : public PromiseWorker {
 public:
  LoadWorker(Napi::Env env, std::vector<std::string> files, slm::Qwen3Config cfg, slm::LoadOptions opts)
      : PromiseWorker(env, "slm:load"), files_(std::move(files)), cfg_(cfg), opts_(std::move(opts)) {}

 protected:
  void Run() override {
    // Not InferenceMode: weights made there could never take part in a training graph.
    at::NoGradGuard guard;
    auto weights = slm::read_safetensors_files(files_);
    model_ = std::make_shared<slm::Qwen3Model>(cfg_, std::move(weights), opts_);
  }
  Napi::Value Result(Napi::Env env) override { return ModelWrap::NewInstance(env, model_); }

 private:
  std::vector<std::string> files_;
  slm::Qwen3Config cfg_;
  slm::LoadOptions opts_;
  std::shared_ptr<slm::Qwen3Model> model_;
};

class LogitsWorker : public PromiseWorker {
 public:
  LogitsWorker(Napi::Env env, Napi::Object owner, std::shared_ptr<slm::Qwen3Model> m, at::Tensor ids, at::Tensor mask, at::Tensor pos)
      : PromiseWorker(env, "slm:logits", owner), m_(std::move(m)), ids_(ids), mask_(mask), pos_(pos) {}

 protected:
  void Run() override {
    c10::InferenceMode guard;
    out_ = slm::full_logits(*m_, ids_, mask_, pos_);
  }
  Napi::Value Result(Napi::Env env) override {
    auto a = Napi::Float32Array::New(env, out_.numel());
    std::memcpy(a.Data(), out_.data_ptr<float>(), out_.numel() * sizeof(float));
    return a;
  }

 private:
  std::shared_ptr<slm::Qwen3Model> m_;
  at::Tensor ids_, mask_, pos_, out_;
};

// Cancel flags of a streamed generate call: one per row, set by the JS `cancel(row)` function on the
// main thread and read by the generating thread.
struct CancelFlags {
  explicit CancelFlags(size_t n) : n(n), v(new std::atomic<uint8_t>[n]) {
    for (size_t i = 0; i < n; ++i) v[i].store(0);
  }
  size_t n;
  std::unique_ptr<std::atomic<uint8_t>[]> v;
};

class GenerateWorker : public PromiseWorker {
 public:
  GenerateWorker(Napi::Env env, Napi::Object owner, std::shared_ptr<slm::Qwen3Model> m, std::shared_ptr<slm::Vocab> vocab, slm::GenerateParams p,
                 std::shared_ptr<slm::EpisodeCacheStore> caches)
      : PromiseWorker(env, "slm:generate", owner), m_(std::move(m)), vocab_(std::move(vocab)), p_(std::move(p)), caches_(std::move(caches)) {
    if (!p_.cache_keys.empty()) p_.episode_cache = caches_.get();
  }
  // Streaming: every decode step's tokens go to `on_step` (a JS function, called on the main thread
  // in order, without blocking generation); `cancel` stops rows.
  void Stream(Napi::Env env, Napi::Function on_step, std::shared_ptr<CancelFlags> cancel) {
    tsfn_ = Napi::ThreadSafeFunction::New(env, on_step, "slm:generate-step", 0, 1);
    streaming_ = true;
    cancel_ = std::move(cancel);
  }

 protected:
  void Run() override {
    c10::InferenceMode guard;
    if (cancel_) p_.cancel = cancel_->v.get();
    if (streaming_) {
      p_.on_step = [this](slm::StepEvent&& e) {
        auto* d = new slm::StepEvent(std::move(e));
        if (tsfn_.NonBlockingCall(d, DeliverStep) != napi_ok) delete d;
      };
    }
    struct Release {  // the step function is released however generate ends
      GenerateWorker* w;
      ~Release() {
        if (w->streaming_) w->tsfn_.Release();
      }
    } release{this};
    out_ = slm::generate(*m_, p_, vocab_.get());
  }
  Napi::Value Result(Napi::Env env) override {
    std::vector<int32_t> tokens, lengths, top_ids;
    std::vector<float> lps, top_lps;
    std::vector<uint8_t> finish;
    for (size_t r = 0; r < out_.tokens.size(); ++r) {
      tokens.insert(tokens.end(), out_.tokens[r].begin(), out_.tokens[r].end());
      lps.insert(lps.end(), out_.logprobs[r].begin(), out_.logprobs[r].end());
      lengths.push_back(static_cast<int32_t>(out_.tokens[r].size()));
      finish.push_back(static_cast<uint8_t>(out_.finish[r]));
      if (r < out_.top_ids.size()) {
        top_ids.insert(top_ids.end(), out_.top_ids[r].begin(), out_.top_ids[r].end());
        top_lps.insert(top_lps.end(), out_.top_logprobs[r].begin(), out_.top_logprobs[r].end());
      }
    }
    auto o = Napi::Object::New(env);
    o.Set("tokens", to_typed(env, tokens));
    o.Set("lengths", to_typed(env, lengths));
    o.Set("logprobs", to_typed(env, lps));
    o.Set("finish", to_typed(env, finish));
    if (p_.top_n > 0) {
      o.Set("topIds", to_typed(env, top_ids));
      o.Set("topLogprobs", to_typed(env, top_lps));
    }
    o.Set("steps", Napi::Number::New(env, static_cast<double>(out_.steps)));
    o.Set("prefillSeconds", Napi::Number::New(env, out_.prefill_seconds));
    o.Set("decodeSeconds", Napi::Number::New(env, out_.decode_seconds));
    o.Set("prefillTokens", Napi::Number::New(env, static_cast<double>(out_.prefill_tokens)));
    o.Set("prefillTokensRequested", Napi::Number::New(env, static_cast<double>(out_.prefill_tokens_requested)));
    o.Set("cacheReusedTokens", Napi::Number::New(env, static_cast<double>(out_.cache_reused_tokens)));
    o.Set("cacheHits", Napi::Number::New(env, static_cast<double>(out_.cache_hits)));
    o.Set("cacheEvicted", Napi::Number::New(env, static_cast<double>(out_.cache_evicted)));
    o.Set("cacheStale", Napi::Number::New(env, static_cast<double>(out_.cache_stale)));
    return o;
  }

 private:
  // Main thread: one step's event as {rows, tokens, logprobs, topIds, topLogprobs, finish} to the JS function.
  static void DeliverStep(Napi::Env env, Napi::Function fn, slm::StepEvent* d) {
    std::unique_ptr<slm::StepEvent> e(d);
    if (!env || !fn) return;
    auto o = Napi::Object::New(env);
    o.Set("rows", to_typed(env, e->rows));
    o.Set("tokens", to_typed(env, e->tokens));
    o.Set("logprobs", to_typed(env, e->logprobs));
    o.Set("topIds", to_typed(env, e->top_ids));
    o.Set("topLogprobs", to_typed(env, e->top_logprobs));
    o.Set("finish", to_typed(env, e->finish));
    try {
      fn.Call({o});
    } catch (const Napi::Error&) {
      // The JS side (lib/engine/model.ts) catches its own errors; nothing to do with one here.
    }
  }

  std::shared_ptr<slm::Qwen3Model> m_;
  std::shared_ptr<slm::Vocab> vocab_;
  slm::GenerateParams p_;
  slm::GenerateOutput out_;
  std::shared_ptr<slm::EpisodeCacheStore> caches_;  // kept alive while the call may use it
  Napi::ThreadSafeFunction tsfn_;
  bool streaming_ = false;
  std::shared_ptr<CancelFlags> cancel_;
};

class LogprobsWorker : public PromiseWorker {
 public:
  // What a teacher-forced pass returns: log-probs, the PPO critic's values, or last-token hidden states.
  enum class Mode { Logprobs, Values, LastHidden };
  LogprobsWorker(Napi::Env env, Napi::Object owner, std::shared_ptr<slm::Qwen3Model> m, std::vector<std::vector<int32_t>> seqs, double temp, Mode mode, bool reference)
      : PromiseWorker(env, mode == Mode::Values ? "slm:values" : mode == Mode::LastHidden ? "slm:hidden" : "slm:logprobs", owner),
        m_(std::move(m)), seqs_(std::move(seqs)), temp_(temp), mode_(mode), reference_(reference) {}

 protected:
  void Run() override {
    c10::InferenceMode guard;
    out_ = mode_ == Mode::Values ? slm::sequence_values(*m_, seqs_) : mode_ == Mode::LastHidden ? slm::last_hidden(*m_, seqs_) : slm::sequence_logprobs(*m_, seqs_, temp_, reference_);
  }
  Napi::Value Result(Napi::Env env) override {
    std::vector<float> flat;
    for (const auto& r : out_) flat.insert(flat.end(), r.begin(), r.end());
    return to_typed(env, flat);
  }

 private:
  std::shared_ptr<slm::Qwen3Model> m_;
  std::vector<std::vector<int32_t>> seqs_;
  double temp_;
  Mode mode_;
  bool reference_;
  std::vector<std::vector<float>> out_;
};

// Splits a flat Int32Array into rows by lengths (checking that they add up).
std::vector<std::vector<int32_t>> split_rows(Napi::Env env, const std::vector<int32_t>& flat, const std::vector<int32_t>& lengths) {
  std::vector<std::vector<int32_t>> rows;
  size_t off = 0;
  for (auto n : lengths) {
    if (n < 0 || off + n > flat.size()) throw_error(env, "ARGUMENT_INVALID", "lengths do not add up to the number of ids.");
    rows.emplace_back(flat.begin() + off, flat.begin() + off + n);
    off += n;
  }
  if (off != flat.size())
    throw_error(env, "ARGUMENT_INVALID", "lengths add up to " + std::to_string(off) + " but " + std::to_string(flat.size()) + " ids were given.");
  return rows;
}

// sequenceLogprobs / sequenceValues / lastHidden: {ids, lengths[, temperature, reference]} -> a worker's Promise.
Napi::Value queue_rows(const Napi::CallbackInfo& info, std::shared_ptr<slm::Qwen3Model> m, const char* name, LogprobsWorker::Mode mode) {
  auto env = info.Env();
  const bool lp = mode == LogprobsWorker::Mode::Logprobs;
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", std::string(name) + (lp ? " expects {ids, lengths, temperature}." : " expects {ids, lengths}."));
  auto o = info[0].As<Napi::Object>();
  auto rows = split_rows(env, int32s(env, o.Get("ids"), "ids"), int32s(env, o.Get("lengths"), "lengths"));
  auto ref = o.Get("reference");
  const bool reference = lp && ref.IsBoolean() && ref.As<Napi::Boolean>().Value();
  auto* w = new LogprobsWorker(env, info.This().As<Napi::Object>(), std::move(m), std::move(rows), lp ? num_field(env, o, "temperature", 1.0) : 1.0, mode, reference);
  auto p = w->Promise();
  w->Queue();
  return p;
}

}  // namespace

Napi::Function ModelWrap::Define(Napi::Env env) {
  auto cls = DefineClass(env, "NativeModel",
                         {InstanceMethod<&ModelWrap::Info>("info"), InstanceMethod<&ModelWrap::SetVocab>("setVocab"),
                          InstanceMethod<&ModelWrap::Logits>("logits"), InstanceMethod<&ModelWrap::Generate>("generate"),
                          InstanceMethod<&ModelWrap::GenerateStream>("generateStream"),
                          InstanceMethod<&ModelWrap::SequenceLogprobs>("sequenceLogprobs"),
                          InstanceMethod<&ModelWrap::SequenceValues>("sequenceValues"),
                          InstanceMethod<&ModelWrap::LastHidden>("lastHidden"), InstanceMethod<&ModelWrap::Dispose>("dispose"),
                          InstanceMethod<&ModelWrap::AttachLora>("attachLora"), InstanceMethod<&ModelWrap::LoadLora>("loadLora"),
                          InstanceMethod<&ModelWrap::DetachLora>("detachLora"), InstanceMethod<&ModelWrap::SaveLora>("saveLora"),
                          InstanceMethod<&ModelWrap::SetReferenceAdapter>("setReferenceAdapter"),
                          InstanceMethod<&ModelWrap::ClearReferenceAdapter>("clearReferenceAdapter"),
                          InstanceMethod<&ModelWrap::HasReferenceAdapter>("hasReferenceAdapter"),
                          InstanceMethod<&ModelWrap::AttachValueHead>("attachValueHead"),
                          InstanceMethod<&ModelWrap::LoadValueHead>("loadValueHead"), InstanceMethod<&ModelWrap::TrainStep>("trainStep"),
                          InstanceMethod<&ModelWrap::SaveOptimizer>("saveOptimizer"),
                          InstanceMethod<&ModelWrap::LoadOptimizer>("loadOptimizer"), InstanceMethod<&ModelWrap::SaveMerged>("saveMerged"),
                          InstanceMethod<&ModelWrap::Trainable>("trainable"), InstanceMethod<&ModelWrap::SetTrainable>("setTrainable"),
                          InstanceMethod<&ModelWrap::Gradients>("gradients"), InstanceMethod<&ModelWrap::ApplyGradients>("applyGradients"),
                          InstanceMethod<&ModelWrap::BaseDigest>("baseDigest"),
                          InstanceMethod<&ModelWrap::ReleaseCaches>("releaseCaches"), InstanceMethod<&ModelWrap::ClearCaches>("clearCaches"),
                          InstanceMethod<&ModelWrap::SetCacheLimit>("setCacheLimit"), InstanceMethod<&ModelWrap::CacheStats>("cacheStats")});
  data(env)->model_class = Napi::Persistent(cls);
  return cls;
}

Napi::Object ModelWrap::NewInstance(Napi::Env env, std::shared_ptr<slm::Qwen3Model> model) {
  auto* holder = new std::shared_ptr<slm::Qwen3Model>(std::move(model));
  auto ext = Napi::External<std::shared_ptr<slm::Qwen3Model>>::New(env, holder, [](Napi::Env, std::shared_ptr<slm::Qwen3Model>* p) { delete p; });
  return data(env)->model_class.New({ext});
}

ModelWrap::ModelWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ModelWrap>(info) {
  if (info.Length() < 1 || !info[0].IsExternal())
    throw_error(info.Env(), "ARGUMENT_INVALID", "NativeModel cannot be constructed directly: use loadModel().");
  model_ = *info[0].As<Napi::External<std::shared_ptr<slm::Qwen3Model>>>().Data();
  vocab_ = std::make_shared<slm::Vocab>();
  optimizer_ = std::make_shared<slm::AdamW>();
  caches_ = std::make_shared<slm::EpisodeCacheStore>();
}

std::shared_ptr<slm::Qwen3Model> ModelWrap::live(Napi::Env env) const {
  if (!model_) throw_error(env, "HANDLE_DISPOSED", "this model was disposed; load it again to use it.");
  return model_;
}

Napi::Value ModelWrap::Load(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "loadModel expects {files, config, dtype, device}.");
  auto o = info[0].As<Napi::Object>();
  auto files_v = o.Get("files");
  if (!files_v.IsArray()) throw_error(env, "ARGUMENT_INVALID", "loadModel: 'files' must be an array of safetensors paths.");
  std::vector<std::string> files;
  auto arr = files_v.As<Napi::Array>();
  for (uint32_t i = 0; i < arr.Length(); ++i) files.push_back(arr.Get(i).As<Napi::String>().Utf8Value());
  if (!o.Get("config").IsObject()) throw_error(env, "ARGUMENT_INVALID", "loadModel: 'config' must be the parsed config.json.");
  auto cfg = read_config(env, o.Get("config").As<Napi::Object>());
  slm::LoadOptions lo;
  ErrorInfo err;
  std::string dtype = str_field(env, o, "dtype", "float32");
  if (!capture([&] { lo.dtype = slm::parse_compute_dtype(dtype); }, err)) throw_error(env, err.code, err.message);
  lo.device = str_field(env, o, "device", "cpu");
  if (!capture([&] { (void)at::Device(lo.device); }, err))
    throw_error(env, "ARGUMENT_INVALID", "device must look like 'cpu', 'cuda' or 'cuda:N', found '" + lo.device + "'.");
  auto* w = new LoadWorker(env, std::move(files), cfg, lo);
  auto p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value ModelWrap::Info(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  const auto& c = m->config();
  auto o = Napi::Object::New(env);
  o.Set("numParameters", Napi::Number::New(env, static_cast<double>(m->num_parameters())));
  o.Set("parameterBytes", Napi::Number::New(env, static_cast<double>(m->parameter_bytes())));
  o.Set("dtype", Napi::String::New(env, c10::toString(m->dtype())));
  o.Set("device", Napi::String::New(env, m->device().str()));
  o.Set("vocabSize", Napi::Number::New(env, static_cast<double>(c.vocab_size)));
  o.Set("numLayers", Napi::Number::New(env, static_cast<double>(c.num_hidden_layers)));
  o.Set("hiddenSize", Napi::Number::New(env, static_cast<double>(c.hidden_size)));
  return o;
}

Napi::Value ModelWrap::SetVocab(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  live(env);
  if (!info[0].IsTypedArray() || !info[1].IsTypedArray()) throw_error(env, "ARGUMENT_INVALID", "setVocab(bytes: Uint8Array, offsets: Int32Array).");
  auto bytes = info[0].As<Napi::Uint8Array>();
  auto offs = int32s(env, info[1], "offsets");
  auto v = std::make_shared<slm::Vocab>();
  for (size_t i = 0; i + 1 < offs.size(); ++i) {
    if (offs[i] < 0 || offs[i] > offs[i + 1] || static_cast<size_t>(offs[i + 1]) > bytes.ElementLength())
      throw_error(env, "ARGUMENT_INVALID", "setVocab: offsets must be non-decreasing and within the byte buffer.");
    v->bytes.emplace_back(reinterpret_cast<const char*>(bytes.Data()) + offs[i], offs[i + 1] - offs[i]);
  }
  vocab_ = v;  // running generations keep the vocabulary they started with
  return env.Undefined();
}

Napi::Value ModelWrap::Logits(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "logits expects {ids, batch, seqLen, attentionMask?, positionIds?}.");
  auto o = info[0].As<Napi::Object>();
  auto ids = int32s(env, o.Get("ids"), "ids");
  const int64_t B = int_field(env, o, "batch", 1), T = int_field(env, o, "seqLen", static_cast<int64_t>(ids.size()));
  if (B <= 0 || T <= 0 || B * T != static_cast<int64_t>(ids.size()))
    throw_error(env, "ARGUMENT_INVALID", "ids hold " + std::to_string(ids.size()) + " values but batch x seqLen = " + std::to_string(B * T) + ".");
  const auto li = at::TensorOptions().dtype(at::kLong);
  auto idt = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), li).view({B, T});
  at::Tensor mask = at::ones({B, T}, li), pos;
  if (!o.Get("attentionMask").IsUndefined()) {
    auto mv = int32s(env, o.Get("attentionMask"), "attentionMask");
    if (static_cast<int64_t>(mv.size()) != B * T) throw_error(env, "ARGUMENT_INVALID", "attentionMask must have batch x seqLen values.");
    mask = at::tensor(std::vector<int64_t>(mv.begin(), mv.end()), li).view({B, T});
  }
  if (!o.Get("positionIds").IsUndefined()) {
    auto pv = int32s(env, o.Get("positionIds"), "positionIds");
    if (static_cast<int64_t>(pv.size()) != B * T) throw_error(env, "ARGUMENT_INVALID", "positionIds must have batch x seqLen values.");
    pos = at::tensor(std::vector<int64_t>(pv.begin(), pv.end()), li).view({B, T});
  } else {
    pos = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1);
  }
  auto* w = new LogitsWorker(env, info.This().As<Napi::Object>(), m, idt, mask, pos);
  auto p = w->Promise();
  w->Queue();
  return p;
}

namespace {
slm::GenerateParams generate_params(Napi::Env env, const Napi::Object& o) {
  slm::GenerateParams p;
  p.prompts = split_rows(env, int32s(env, o.Get("ids"), "ids"), int32s(env, o.Get("lengths"), "lengths"));
  p.max_new_tokens = int_field(env, o, "maxNewTokens", 64);
  p.temperature = float32s(env, o.Get("temperature"), "temperature");
  p.top_k = int_field(env, o, "topK", 0);
  p.top_p = num_field(env, o, "topP", 1.0);
  auto rtp = o.Get("rowTopP");
  if (!rtp.IsUndefined() && !rtp.IsNull()) {
    p.row_top_p = float32s(env, rtp, "rowTopP");
    for (auto q : p.row_top_p)
      if (!(q > 0.f && q <= 1.f)) throw_error(env, "ARGUMENT_INVALID", "generate: every rowTopP value must be in (0, 1].");
  }
  p.seed = static_cast<uint64_t>(num_field(env, o, "seed", 0));
  p.top_n = int_field(env, o, "topN", 0);
  if (p.top_n < 0) throw_error(env, "ARGUMENT_INVALID", "generate: topN must be a non-negative integer.");
  auto rs = o.Get("rowSeeds");
  if (!rs.IsUndefined() && !rs.IsNull()) {
    if (!rs.IsArray()) throw_error(env, "ARGUMENT_INVALID", "generate: rowSeeds must be an array of non-negative integers, one per row.");
    auto a = rs.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) {
      auto v = a.Get(i);
      const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
      if (!(d >= 0) || d > 9007199254740991.0 || d != static_cast<double>(static_cast<uint64_t>(d)))
        throw_error(env, "ARGUMENT_INVALID", "generate: rowSeeds[" + std::to_string(i) + "] must be a non-negative integer below 2^53.");
      p.row_seeds.push_back(static_cast<uint64_t>(d));
    }
  }
  auto rm = o.Get("rowMaxNewTokens");
  if (!rm.IsUndefined() && !rm.IsNull()) {
    auto v = int32s(env, rm, "rowMaxNewTokens");
    p.row_max_new_tokens.assign(v.begin(), v.end());
  }
  p.pad_id = static_cast<int32_t>(int_field(env, o, "padId", 0));
  auto sp = o.Get("sharePrefix");
  if (!sp.IsUndefined() && !sp.IsNull()) {
    if (!sp.IsBoolean()) throw_error(env, "ARGUMENT_INVALID", "generate: sharePrefix must be a boolean.");
    p.share_prefix = sp.As<Napi::Boolean>().Value();
  }
  auto ck = o.Get("cacheKeys");
  if (!ck.IsUndefined() && !ck.IsNull()) {
    if (!ck.IsArray()) throw_error(env, "ARGUMENT_INVALID", "generate: cacheKeys must be an array with one string (or null: none) per row.");
    auto a = ck.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) {
      auto v = a.Get(i);
      if (v.IsUndefined() || v.IsNull()) p.cache_keys.emplace_back();
      else if (v.IsString()) p.cache_keys.push_back(v.As<Napi::String>().Utf8Value());
      else throw_error(env, "ARGUMENT_INVALID", "generate: cacheKeys[" + std::to_string(i) + "] must be a string or null.");
    }
    bool any = false;
    for (const auto& k : p.cache_keys) any = any || !k.empty();
    if (!any) p.cache_keys.clear();
  }
  if (!o.Get("stopTokenIds").IsUndefined()) p.stop_token_ids = int32s(env, o.Get("stopTokenIds"), "stopTokenIds");
  auto ss = o.Get("stopStrings");
  if (ss.IsArray()) {
    auto a = ss.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) p.stop_strings.push_back(a.Get(i).As<Napi::String>().Utf8Value());
  }
  return p;
}
}  // namespace

Napi::Value ModelWrap::Generate(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "generate expects a request object.");
  auto* w = new GenerateWorker(env, info.This().As<Napi::Object>(), m, vocab_, generate_params(env, info[0].As<Napi::Object>()), caches_);
  auto pr = w->Promise();
  w->Queue();
  return pr;
}

// generateStream(req, onStep) -> {done: Promise<result>, cancel(row)}: generate, with every decode
// step's tokens handed to onStep as they are sampled, and rows that can be stopped early.
Napi::Value ModelWrap::GenerateStream(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  if (!info[0].IsObject() || !info[1].IsFunction()) throw_error(env, "ARGUMENT_INVALID", "generateStream expects a request object and a step function.");
  auto p = generate_params(env, info[0].As<Napi::Object>());
  auto flags = std::make_shared<CancelFlags>(p.prompts.size());
  auto* w = new GenerateWorker(env, info.This().As<Napi::Object>(), m, vocab_, std::move(p), caches_);
  w->Stream(env, info[1].As<Napi::Function>(), flags);
  auto o = Napi::Object::New(env);
  o.Set("done", w->Promise());
  o.Set("cancel", Napi::Function::New(env, [flags](const Napi::CallbackInfo& ci) -> Napi::Value {
          auto e = ci.Env();
          if (!ci[0].IsNumber()) throw_error(e, "ARGUMENT_INVALID", "cancel expects a row index.");
          const int64_t r = ci[0].As<Napi::Number>().Int64Value();
          if (r < 0 || static_cast<size_t>(r) >= flags->n) throw_error(e, "ARGUMENT_INVALID", "cancel: row " + std::to_string(r) + " is not in this call.");
          flags->v[r].store(1);
          return e.Undefined();
        }, "cancel"));
  w->Queue();
  return o;
}

Napi::Value ModelWrap::SequenceLogprobs(const Napi::CallbackInfo& info) {
  return queue_rows(info, live(info.Env()), "sequenceLogprobs", LogprobsWorker::Mode::Logprobs);
}

Napi::Value ModelWrap::SequenceValues(const Napi::CallbackInfo& info) {
  auto m = live(info.Env());
  if (!m->value_w.defined()) throw_error(info.Env(), "NOT_SUPPORTED", "values: no value head is attached; call attachValueHead() or load an adapter saved with one.");
  return queue_rows(info, m, "sequenceValues", LogprobsWorker::Mode::Values);
}

Napi::Value ModelWrap::LastHidden(const Napi::CallbackInfo& info) {
  return queue_rows(info, live(info.Env()), "lastHidden", LogprobsWorker::Mode::LastHidden);
}

Napi::Value ModelWrap::Dispose(const Napi::CallbackInfo& info) {
  model_.reset();  // running workers hold their own reference; memory goes when they finish
  vocab_.reset();
  if (caches_) caches_->clear();
  return info.Env().Undefined();
}

// releaseCaches(keys: string[]): the episode caches of these keys are freed (unknown keys: nothing);
// clearCaches(): all of them; setCacheLimit(bytes): the store's byte limit (least recently used
// caches evicted beyond it); cacheStats() -> {entries, tokens, bytes, limitBytes, evicted, stale}.
Napi::Value ModelWrap::ReleaseCaches(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  live(env);
  if (!info[0].IsArray()) throw_error(env, "ARGUMENT_INVALID", "releaseCaches expects an array of cache keys (strings).");
  auto a = info[0].As<Napi::Array>();
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < a.Length(); ++i) {
    auto v = a.Get(i);
    if (!v.IsString()) throw_error(env, "ARGUMENT_INVALID", "releaseCaches: keys[" + std::to_string(i) + "] must be a string.");
    keys.push_back(v.As<Napi::String>().Utf8Value());
  }
  caches_->release(keys);
  return env.Undefined();
}

Napi::Value ModelWrap::ClearCaches(const Napi::CallbackInfo& info) {
  live(info.Env());
  caches_->clear();
  return info.Env().Undefined();
}

Napi::Value ModelWrap::SetCacheLimit(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  live(env);
  const double d = info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
  if (!(d >= 0) || d > 9007199254740991.0 || d != static_cast<double>(static_cast<int64_t>(d)))
    throw_error(env, "ARGUMENT_INVALID", "setCacheLimit expects a byte count: a non-negative integer.");
  caches_->set_limit(static_cast<int64_t>(d));
  return env.Undefined();
}

Napi::Value ModelWrap::CacheStats(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  live(env);
  const auto s = caches_->stats();
  auto o = Napi::Object::New(env);
  o.Set("entries", Napi::Number::New(env, static_cast<double>(s.entries)));
  o.Set("tokens", Napi::Number::New(env, static_cast<double>(s.tokens)));
  o.Set("bytes", Napi::Number::New(env, static_cast<double>(s.bytes)));
  o.Set("limitBytes", Napi::Number::New(env, static_cast<double>(s.limit_bytes)));
  o.Set("evicted", Napi::Number::New(env, static_cast<double>(s.evicted)));
  o.Set("stale", Napi::Number::New(env, static_cast<double>(s.stale)));
  return o;
}

}  // namespace slm_addon
