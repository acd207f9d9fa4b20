// The NativeModel handle itself: loading, info, vocabulary, the leases that keep async calls from
// racing a change of the model (MODEL_BUSY), the native memory V8 is told about, and Dispose.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <memory>

#include "addon/convert.h"
#include "addon/model.h"
#include "addon/workers.h"
#include "core/critic.h"
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

// Bytes of every LoRA, reference-adapter and critic-adapter tensor and the value head.
int64_t adapter_bytes(const slm::Qwen3Model& m) {
  int64_t n = 0;
  auto add = [&n](const at::Tensor& t) { n += t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  for (const auto& L : m.layers())
    for (const auto& [name, lin] : L.projections()) {
      (void)name;
      if (lin->lora) add(lin->lora->A), add(lin->lora->B);
      if (lin->reference) add(lin->reference->A), add(lin->reference->B);
    }
  return n + m.value_head.bytes() + slm::critic_bytes(m);
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
                          InstanceMethod<&ModelWrap::AttachCritic>("attachCritic"), InstanceMethod<&ModelWrap::LoadCritic>("loadCritic"),
                          InstanceMethod<&ModelWrap::DetachCritic>("detachCritic"), InstanceMethod<&ModelWrap::HasCritic>("hasCritic"),
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
  critic_optimizer_ = std::make_shared<slm::AdamW>();
  caches_ = std::make_shared<slm::EpisodeCacheStore>();
  account(info.Env());
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
  o.Set("nativeBytes", Napi::Number::New(env, static_cast<double>(external_bytes_)));
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

Lease ModelWrap::lease(Napi::Env env, const char* what, bool writer) const {
  live(env);
  const int r = usage_->readers.load(), w = usage_->writers.load();
  if (w > 0 || (writer && r > 0))
    throw_error(env, "MODEL_BUSY",
                std::string(what) + ": the model is in use by " + std::to_string(r + w) + " running call(s) (" + (w > 0 ? "a train step, an adapter or optimizer load" : "generation or forward passes") +
                    "); await them before " + (writer ? "changing the model." : "starting another call."));
  return Lease(usage_, writer);
}

void ModelWrap::idle(Napi::Env env, const char* what) const { (void)lease(env, what, true); }

void ModelWrap::not_writing(Napi::Env env, const char* what) const { (void)lease(env, what, false); }

void ModelWrap::account(Napi::Env env) {
  int64_t now = caches_ ? caches_->stats().bytes : 0;  // episode KV caches (outlive a disposed model only until Dispose clears them)
  if (model_) now += model_->parameter_bytes() + adapter_bytes(*model_) + (optimizer_ ? optimizer_->bytes() : 0) + (critic_optimizer_ ? critic_optimizer_->bytes() : 0);
  if (now != external_bytes_) Napi::MemoryManagement::AdjustExternalMemory(env, now - external_bytes_);
  external_bytes_ = now;
}

ModelWrap::~ModelWrap() {
  if (external_bytes_ != 0) Napi::MemoryManagement::AdjustExternalMemory(Env(), -external_bytes_);
}

Napi::Value ModelWrap::Dispose(const Napi::CallbackInfo& info) {
  // The model (with its adapter, reference adapter and value head), the optimizer state, the
  // episode KV caches and the vocabulary. Running workers hold their own reference; that memory goes
  // when they finish.
  model_.reset();
  optimizer_.reset();
  critic_optimizer_.reset();
  vocab_.reset();
  if (caches_) caches_->clear();
  account(info.Env());
  return info.Env().Undefined();
}

}  // namespace slm_addon
