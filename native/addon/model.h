// The JS `NativeModel` class: a handle on a loaded model (weights on their device) and what reads
// them: info, the vocabulary's byte strings (for stop strings), forward passes and generation, the
// episode KV caches, the merged export and the base weights' digest, and dispose. Its adapter set,
// value head and optimizer are handles of their own, made with it and shared through ModelState
// (model_state.h lists the four). Every method that computes returns a Promise.
// Files: model.cc (loading, info, vocabulary, caches, export, dispose), model_forward.cc (forward
// passes and generation).
#pragma once
#include <napi.h>

#include <memory>

#include "addon/model_state.h"
#include "core/generate.h"

namespace slm_addon {

class ModelWrap : public StateWrap<ModelWrap> {
 public:
  static constexpr const char* kName = "NativeModel";
  static Napi::Function Define(Napi::Env env);
  // Makes the model's handle and its adapter set, value head and optimizer on one ModelState.
  static Napi::Object NewInstance(Napi::Env env, std::shared_ptr<slm::Qwen3Model> model);
  explicit ModelWrap(const Napi::CallbackInfo& info);

  // loadModel({files, config, dtype, device}) -> Promise<NativeModel>
  static Napi::Value Load(const Napi::CallbackInfo& info);

 private:
  Napi::Value Info(const Napi::CallbackInfo& info);
  Napi::Value SetVocab(const Napi::CallbackInfo& info);
  // Forward passes and generation (model_forward.cc).
  Napi::Value Logits(const Napi::CallbackInfo& info);
  Napi::Value Generate(const Napi::CallbackInfo& info);
  Napi::Value GenerateStream(const Napi::CallbackInfo& info);
  // Continuous batching: rows submitted while the loop runs (session.cc).
  Napi::Value DecodeSession(const Napi::CallbackInfo& info);
  Napi::Value SequenceLogprobs(const Napi::CallbackInfo& info);
  Napi::Value LastHidden(const Napi::CallbackInfo& info);
  // Episode KV caches (core/episode_cache.h), used by generate requests with cacheKeys.
  Napi::Value ReleaseCaches(const Napi::CallbackInfo& info);
  Napi::Value ClearCaches(const Napi::CallbackInfo& info);
  Napi::Value SetCacheLimit(const Napi::CallbackInfo& info);
  Napi::Value CacheStats(const Napi::CallbackInfo& info);
  Napi::Value SaveMerged(const Napi::CallbackInfo& info);
  Napi::Value BaseDigest(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
};

// One decode step's tokens as the JS object generateStream's and decodeSession's step functions get:
// {rows, tokens, logprobs, topIds, topLogprobs, finish} (model_forward.cc).
Napi::Object step_event_object(Napi::Env env, const slm::StepEvent& e);

// The teacher-forced passes (model_forward.cc): what one returns per token.
enum class Rows { Logprobs, Values, LastHidden };

// sequenceLogprobs / values / lastHidden: {ids, lengths[, temperature (number | Float32Array per
// row), reference, mask (Uint8Array per token)]} -> a worker's Promise of the flat per-token result.
Napi::Value queue_rows(const Napi::CallbackInfo& info, std::shared_ptr<slm::Qwen3Model> m, Lease lease, const char* name, Rows mode);

}  // namespace slm_addon
