// The NativeModel handle itself: loading (which makes the adapter set, value head and optimizer
// handles beside it), info, vocabulary, the episode KV caches, the merged export, the base weights'
// digest and dispose.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <memory>

#include "addon/convert.h"
#include "addon/model.h"
#include "addon/workers.h"
#include "core/lora.h"
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

}  // namespace

Napi::Function ModelWrap::Define(Napi::Env env) {
  auto cls =
      DefineClass(env, kName,
                  {InstanceMethod<&ModelWrap::Info>("info"), InstanceMethod<&ModelWrap::SetVocab>("setVocab"),
                   InstanceMethod<&ModelWrap::Logits>("logits"), InstanceMethod<&ModelWrap::Generate>("generate"),
                   InstanceMethod<&ModelWrap::GenerateStream>("generateStream"), InstanceMethod<&ModelWrap::DecodeSession>("decodeSession"),
                   InstanceMethod<&ModelWrap::SequenceLogprobs>("sequenceLogprobs"), InstanceMethod<&ModelWrap::LastHidden>("lastHidden"),
                   InstanceMethod<&ModelWrap::ReleaseCaches>("releaseCaches"), InstanceMethod<&ModelWrap::ClearCaches>("clearCaches"),
                   InstanceMethod<&ModelWrap::SetCacheLimit>("setCacheLimit"), InstanceMethod<&ModelWrap::CacheStats>("cacheStats"),
                   InstanceMethod<&ModelWrap::SaveMerged>("saveMerged"), InstanceMethod<&ModelWrap::BaseDigest>("baseDigest"),
                   InstanceMethod<&ModelWrap::Dispose>("dispose")});
  data(env)->model_class = Napi::Persistent(cls);
  return cls;
}

Napi::Object ModelWrap::NewInstance(Napi::Env env, std::shared_ptr<slm::Qwen3Model> model) {
  return new_handle(env, data(env)->model_class, std::make_shared<ModelState>(std::move(model)));
}

// The model's handle, and its parts as read-only properties on the same state.
ModelWrap::ModelWrap(const Napi::CallbackInfo& info) : StateWrap<ModelWrap>(info) {
  auto env = info.Env();
  auto* d = data(env);
  info.This().As<Napi::Object>().DefineProperties({
      Napi::PropertyDescriptor::Value("adapters", new_handle(env, d->adapter_set_class, s_), napi_enumerable),
      Napi::PropertyDescriptor::Value("valueHead", new_handle(env, d->value_head_class, s_), napi_enumerable),
      Napi::PropertyDescriptor::Value("optimizer", new_handle(env, d->optimizer_class, s_), napi_enumerable),
  });
  s_->account(env);
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
  auto model = std::make_shared<std::shared_ptr<slm::Qwen3Model>>();
  return LambdaWorker::Start(
      env, "slm:load", Napi::Object(),
      [files = std::move(files), cfg, lo, model] {
        // Not InferenceMode: weights made there could never take part in a training graph.
        at::NoGradGuard guard;
        auto weights = slm::read_safetensors_files(files);
        *model = std::make_shared<slm::Qwen3Model>(cfg, std::move(weights), lo);
      },
      [model](Napi::Env e) { return ModelWrap::NewInstance(e, *model); });
}

Napi::Value ModelWrap::Info(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  const auto& c = m->config();
  auto o = Napi::Object::New(env);
  o.Set("numParameters", Napi::Number::New(env, static_cast<double>(m->num_parameters())));
  o.Set("parameterBytes", Napi::Number::New(env, static_cast<double>(m->parameter_bytes())));
  o.Set("dtype", Napi::String::New(env, c10::toString(m->dtype())));
  o.Set("device", Napi::String::New(env, m->device().str()));
  o.Set("vocabSize", Napi::Number::New(env, static_cast<double>(c.vocab_size)));
  o.Set("numLayers", Napi::Number::New(env, static_cast<double>(c.num_hidden_layers)));
  o.Set("hiddenSize", Napi::Number::New(env, static_cast<double>(c.hidden_size)));
  o.Set("nativeBytes", Napi::Number::New(env, static_cast<double>(s_->external_bytes)));
  return o;
}

Napi::Value ModelWrap::SetVocab(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  s_->live(env);
  if (!info[0].IsTypedArray() || !info[1].IsTypedArray())
    throw_error(env, "ARGUMENT_INVALID", "setVocab(bytes: Uint8Array, offsets: Int32Array).");
  auto bytes = info[0].As<Napi::Uint8Array>();
  auto offs = int32s(env, info[1], "offsets");
  auto v = std::make_shared<slm::Vocab>();
  for (size_t i = 0; i + 1 < offs.size(); ++i) {
    if (offs[i] < 0 || offs[i] > offs[i + 1] || static_cast<size_t>(offs[i + 1]) > bytes.ElementLength())
      throw_error(env, "ARGUMENT_INVALID", "setVocab: offsets must be non-decreasing and within the byte buffer.");
    v->bytes.emplace_back(reinterpret_cast<const char*>(bytes.Data()) + offs[i], offs[i + 1] - offs[i]);
  }
  s_->vocab = v;  // running generations keep the vocabulary they started with
  return env.Undefined();
}

// releaseCaches(keys: string[]): the episode caches of these keys are freed (unknown keys: nothing);
// clearCaches(): all of them; setCacheLimit(bytes): the store's byte limit (least recently used
// caches evicted beyond it); cacheStats() -> {entries, tokens, bytes, limitBytes, evicted, stale}.
Napi::Value ModelWrap::ReleaseCaches(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  s_->live(env);
  if (!info[0].IsArray()) throw_error(env, "ARGUMENT_INVALID", "releaseCaches expects an array of cache keys (strings).");
  auto a = info[0].As<Napi::Array>();
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < a.Length(); ++i) {
    auto v = a.Get(i);
    if (!v.IsString()) throw_error(env, "ARGUMENT_INVALID", "releaseCaches: keys[" + std::to_string(i) + "] must be a string.");
    keys.push_back(v.As<Napi::String>().Utf8Value());
  }
  s_->caches->release(keys);
  s_->account(env);
  return env.Undefined();
}

Napi::Value ModelWrap::ClearCaches(const Napi::CallbackInfo& info) {
  s_->live(info.Env());
  s_->caches->clear();
  s_->account(info.Env());
  return info.Env().Undefined();
}

Napi::Value ModelWrap::SetCacheLimit(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  s_->live(env);
  const double d = info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
  if (!(d >= 0) || d > 9007199254740991.0 || d != static_cast<double>(static_cast<int64_t>(d)))
    throw_error(env, "ARGUMENT_INVALID", "setCacheLimit expects a byte count: a non-negative integer.");
  s_->caches->set_limit(static_cast<int64_t>(d));
  s_->account(env);
  return env.Undefined();
}

Napi::Value ModelWrap::CacheStats(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  s_->live(env);
  const auto s = s_->caches->stats();
  auto o = Napi::Object::New(env);
  o.Set("entries", Napi::Number::New(env, static_cast<double>(s.entries)));
  o.Set("tokens", Napi::Number::New(env, static_cast<double>(s.tokens)));
  o.Set("bytes", Napi::Number::New(env, static_cast<double>(s.bytes)));
  o.Set("limitBytes", Napi::Number::New(env, static_cast<double>(s.limit_bytes)));
  o.Set("evicted", Napi::Number::New(env, static_cast<double>(s.evicted)));
  o.Set("stale", Napi::Number::New(env, static_cast<double>(s.stale)));
  return o;
}

Napi::Value ModelWrap::SaveMerged(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  auto o = info[0].As<Napi::Object>();
  auto file = str_field(env, o, "file", "");
  auto dtype_s = str_field(env, o, "dtype", "float32");
  ErrorInfo err;
  at::ScalarType dtype = at::kFloat;
  if (!capture([&] { dtype = slm::parse_compute_dtype(dtype_s); }, err)) throw_error(env, err.code, err.message);
  return LambdaWorker::Start(
      env, "slm:saveMerged", info.This().As<Napi::Object>(),
      [m, file, dtype] {
        slm::write_safetensors(file, slm::merged_weights(*m, dtype), {{"format", "pt"}});
      },
      [](Napi::Env e) { return e.Undefined(); }, s_->lease(env, "saveMerged", false));
}

// A digest of every base weight's bytes (FNV-1a), to prove that training leaves them untouched.
Napi::Value ModelWrap::BaseDigest(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->not_writing(env, "baseDigest");
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : m->named_weights()) {
    (void)name;
    auto c = t.detach().to(at::kCPU).contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    const size_t n = c.numel() * c.element_size();
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, std::min<size_t>(8, n - i));
      h = (h ^ w) * 1099511628211ull;
    }
  }
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return Napi::String::New(env, buf);
}

Napi::Value ModelWrap::Dispose(const Napi::CallbackInfo& info) {
  // The model (with its adapter, reference adapter, critic and value head), the optimizer state, the
  // episode KV caches and the vocabulary, for this handle and its parts. Running workers hold their
  // own reference; that memory goes when they finish.
  s_->dispose(info.Env());
  return info.Env().Undefined();
}

}  // namespace slm_addon
