// The JS `NativeValueHead` class (model.valueHead): PPO's critic on a loaded model. The value head (a
// linear layer over the last hidden state: attach a fresh one, load a saved one), the separate critic
// (core/critic.h: a second LoRA adapter on the same frozen base weights, with its own optimizer state;
// attach, load, detach) and the values they predict. Shares the model's state (model_state.h).
#pragma once
#include <napi.h>

#include <functional>

#include "addon/model_state.h"

namespace slm_addon {

class ValueHeadWrap : public StateWrap<ValueHeadWrap> {
 public:
  static constexpr const char* kName = "NativeValueHead";
  static Napi::Function Define(Napi::Env env);
  using StateWrap<ValueHeadWrap>::StateWrap;

 private:
  Napi::Value Attach(const Napi::CallbackInfo& info);
  Napi::Value Load(const Napi::CallbackInfo& info);
  Napi::Value Values(const Napi::CallbackInfo& info);
  Napi::Value AttachCritic(const Napi::CallbackInfo& info);
  Napi::Value LoadCritic(const Napi::CallbackInfo& info);
  Napi::Value DetachCritic(const Napi::CallbackInfo& info);
  Napi::Value HasCritic(const Napi::CallbackInfo& info);
  // A synchronous change of the critic adapter: refused while a call runs, a fresh critic
  // optimizer, the native bytes re-counted.
  Napi::Value ChangeCritic(Napi::Env env, const char* what, const std::function<void(slm::Qwen3Model&)>& change);
};

}  // namespace slm_addon
