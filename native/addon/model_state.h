// What the four handles of one loaded model share. A loaded model crosses to JS as one handle per
// concept (lib/binding/types.ts types each):
//   NativeModel      (model.h: ModelWrap)         the weights: info, vocabulary, forward passes and
//                                                   generation, episode KV caches, merged export, dispose;
//   NativeAdapterSet (adapters.h: AdapterSetWrap)   its LoRA adapter and frozen reference adapter, and
//                                                   the trainable tensors' values;
//   NativeValueHead  (value_head.h: ValueHeadWrap)  PPO's critic: the value head, the separate critic
//                                                   adapter, the values it predicts;
//   NativeOptimizer  (optimizer.h: OptimizerWrap)   training: train steps, gradients, AdamW state.
// The last three are properties of the first (model.adapters, model.valueHead, model.optimizer) and
// hold the same ModelState, so that a lease taken by any of them keeps the others from changing what
// it reads (MODEL_BUSY), the native bytes V8 is told about are one count, and dispose() on the model
// disposes them all (HANDLE_DISPOSED from then on).
#pragma once
#include <napi.h>

#include <memory>
#include <string>

#include "addon/errors.h"
#include "addon/workers.h"
#include "core/episode_cache.h"
#include "core/generate.h"
#include "core/optimizer.h"
#include "core/qwen3.h"

namespace slm_addon {

struct ModelState {
  explicit ModelState(std::shared_ptr<slm::Qwen3Model> m);
  ~ModelState();  // gives back to V8 the bytes it was last told
  ModelState(const ModelState&) = delete;
  ModelState& operator=(const ModelState&) = delete;

  // The model, or HANDLE_DISPOSED once dispose() ran.
  std::shared_ptr<slm::Qwen3Model> live(Napi::Env env) const;
  // A lease for an async call: MODEL_BUSY when a writer runs, or any call runs and `writer`.
  Lease lease(Napi::Env env, const char* what, bool writer) const;
  // MODEL_BUSY unless no async call is running (synchronous changes: attach an adapter, setTrainable, ...).
  void idle(Napi::Env env, const char* what) const { (void)lease(env, what, true); }
  // MODEL_BUSY while a writer runs (synchronous reads of the trainable tensors).
  void not_writing(Napi::Env env, const char* what) const { (void)lease(env, what, false); }
  // Tells V8 the native bytes held now (the difference from the last report): weights, adapters,
  // reference and critic adapters, value head, both optimizers' state, episode KV caches.
  void account(Napi::Env env);
  // Drops the model (with its adapters and value head), the optimizer state, the caches and the
  // vocabulary; running workers keep their own reference until they end.
  void dispose(Napi::Env env);

  std::shared_ptr<slm::Qwen3Model> model;
  std::shared_ptr<slm::Vocab> vocab = std::make_shared<slm::Vocab>();
  std::shared_ptr<slm::AdamW> optimizer = std::make_shared<slm::AdamW>();
  std::shared_ptr<slm::AdamW> critic_optimizer = std::make_shared<slm::AdamW>();  // the separate critic's
  std::shared_ptr<slm::EpisodeCacheStore> caches = std::make_shared<slm::EpisodeCacheStore>();
  std::shared_ptr<Usage> usage = std::make_shared<Usage>();
  int64_t external_bytes = 0;  // what V8 was last told
  napi_env env = nullptr;      // where it was told
};

// A handle on one concept of a loaded model: a JS object holding the shared ModelState. Made only by
// loadModel (new_handle); `new` from JS is refused.
template <class T>
class StateWrap : public Napi::ObjectWrap<T> {
 public:
  explicit StateWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<T>(info) {
    if (info.Length() < 1 || !info[0].IsExternal())
      throw_error(info.Env(), "ARGUMENT_INVALID", std::string(T::kName) + " cannot be constructed directly: use loadModel().");
    s_ = *info[0].As<Napi::External<std::shared_ptr<ModelState>>>().Data();
  }

 protected:
  std::shared_ptr<ModelState> s_;
};

// A new JS object of the class `cls` (one of the four above) on the state `s`.
Napi::Object new_handle(Napi::Env env, const Napi::FunctionReference& cls, std::shared_ptr<ModelState> s);

}  // namespace slm_addon
