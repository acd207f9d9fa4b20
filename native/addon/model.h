// The JS `NativeModel` class: a handle on a loaded Qwen3 model (weights on their device, with its
// adapter, reference adapter and value head), the optimizer state of its training, and the
// vocabulary's byte strings (for stop strings). Every method that computes returns a Promise.
// Files: model_load.cc (loading, info, vocab), model.cc (forward passes, generation, dispose),
// model_train.cc (adapters, value head, train steps, optimizer), model_critic.cc (PPO's separate critic).
//
// Concurrency: an async call holds a Lease on the model until it ends (readers share, a writer is
// alone); a call that would change what a running call reads is refused with MODEL_BUSY.
// Memory: V8 is told the native bytes the handle holds (AdjustExternalMemory: weights, adapters,
// optimizer state, episode KV caches; updated when a call that changes them ends), and Dispose gives
// everything back (running workers keep their own reference until they end).
#pragma once
#include <napi.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/episode_cache.h"
#include "core/forward.h"
#include "core/generate.h"
#include "core/qwen3.h"
#include "addon/workers.h"
#include "core/optimizer.h"

namespace slm_addon {

// The optimizer file's tensors: the actor's AdamW state, and the separate critic's (when it has
// stepped) under "critic/" names; and the inverse (no "critic/" entries: a fresh critic optimizer).
std::map<std::string, at::Tensor> optimizer_state(const slm::AdamW& actor, const slm::AdamW* critic);
void load_optimizer_state(std::map<std::string, at::Tensor>&& s, slm::AdamW& actor, slm::AdamW& critic, const at::Device& dev);

class ModelWrap : public Napi::ObjectWrap<ModelWrap> {
 public:
  static Napi::Function Define(Napi::Env env);
  static Napi::Object NewInstance(Napi::Env env, std::shared_ptr<slm::Qwen3Model> model);
  explicit ModelWrap(const Napi::CallbackInfo& info);

  // loadModel({files, config, dtype, device}) -> Promise<NativeModel>
  static Napi::Value Load(const Napi::CallbackInfo& info);

 private:
  std::shared_ptr<slm::Qwen3Model> live(Napi::Env env) const;
  // A lease for an async call (MODEL_BUSY when a writer runs, or any call runs and `writer`).
  Lease lease(Napi::Env env, const char* what, bool writer) const;
  // MODEL_BUSY unless no async call is running (synchronous changes: attachLora, setTrainable, ...).
  void idle(Napi::Env env, const char* what) const;
  // MODEL_BUSY while a writer runs (synchronous reads of the trainable tensors).
  void not_writing(Napi::Env env, const char* what) const;
  // Tells V8 the native bytes this handle holds now (the difference from the last report).
  void account(Napi::Env env);
  Napi::Value Info(const Napi::CallbackInfo& info);
  Napi::Value SetVocab(const Napi::CallbackInfo& info);
  Napi::Value Logits(const Napi::CallbackInfo& info);
  Napi::Value Generate(const Napi::CallbackInfo& info);
  Napi::Value GenerateStream(const Napi::CallbackInfo& info);
  Napi::Value SequenceLogprobs(const Napi::CallbackInfo& info);
  Napi::Value SequenceValues(const Napi::CallbackInfo& info);
  Napi::Value LastHidden(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  // Episode KV caches (core/episode_cache.h), used by generate requests with cacheKeys.
  Napi::Value ReleaseCaches(const Napi::CallbackInfo& info);
  Napi::Value ClearCaches(const Napi::CallbackInfo& info);
  Napi::Value SetCacheLimit(const Napi::CallbackInfo& info);
  Napi::Value CacheStats(const Napi::CallbackInfo& info);
  // LoRA training core (model_train.cc)
  Napi::Value AttachLora(const Napi::CallbackInfo& info);
  Napi::Value LoadLora(const Napi::CallbackInfo& info);
  Napi::Value DetachLora(const Napi::CallbackInfo& info);
  Napi::Value SaveLora(const Napi::CallbackInfo& info);
  Napi::Value SetReferenceAdapter(const Napi::CallbackInfo& info);
  Napi::Value ClearReferenceAdapter(const Napi::CallbackInfo& info);
  Napi::Value HasReferenceAdapter(const Napi::CallbackInfo& info);
  // PPO's separate critic (model_critic.cc)
  Napi::Value AttachCritic(const Napi::CallbackInfo& info);
  Napi::Value LoadCritic(const Napi::CallbackInfo& info);
  Napi::Value DetachCritic(const Napi::CallbackInfo& info);
  Napi::Value HasCritic(const Napi::CallbackInfo& info);
  Napi::Value ChangeCritic(Napi::Env env, const char* what, const std::function<void(slm::Qwen3Model&)>& change);
  Napi::Value AttachValueHead(const Napi::CallbackInfo& info);
  Napi::Value LoadValueHead(const Napi::CallbackInfo& info);
  Napi::Value TrainStep(const Napi::CallbackInfo& info);
  Napi::Value SaveOptimizer(const Napi::CallbackInfo& info);
  Napi::Value LoadOptimizer(const Napi::CallbackInfo& info);
  Napi::Value SaveMerged(const Napi::CallbackInfo& info);
  Napi::Value Trainable(const Napi::CallbackInfo& info);
  Napi::Value SetTrainable(const Napi::CallbackInfo& info);
  Napi::Value Gradients(const Napi::CallbackInfo& info);
  Napi::Value ApplyGradients(const Napi::CallbackInfo& info);
  Napi::Value BaseDigest(const Napi::CallbackInfo& info);

  std::shared_ptr<slm::Qwen3Model> model_;
  std::shared_ptr<slm::Vocab> vocab_;
  std::shared_ptr<slm::AdamW> optimizer_;
  std::shared_ptr<slm::AdamW> critic_optimizer_;  // the separate critic's (model_critic.cc)
  std::shared_ptr<slm::EpisodeCacheStore> caches_;
  std::shared_ptr<Usage> usage_ = std::make_shared<Usage>();
  int64_t external_bytes_ = 0;  // what V8 was last told

 public:
  ~ModelWrap() override;
};

}  // namespace slm_addon
