// The JS `NativeAdapterSet` class (model.adapters): the LoRA adapter on a loaded model's frozen base
// weights (attach a fresh one, load / save PEFT files, detach), the frozen reference adapter of the KL
// term, and the values of the trainable tensors (the adapter, the separate critic's adapter and the
// value head: what data-parallel ranks synchronise). Shares the model's state (model_state.h).
#pragma once
#include <napi.h>

#include "addon/model_state.h"

namespace slm_addon {

class AdapterSetWrap : public StateWrap<AdapterSetWrap> {
 public:
  static constexpr const char* kName = "NativeAdapterSet";
  static Napi::Function Define(Napi::Env env);
  using StateWrap<AdapterSetWrap>::StateWrap;

 private:
  Napi::Value Attach(const Napi::CallbackInfo& info);
  Napi::Value Load(const Napi::CallbackInfo& info);
  Napi::Value Detach(const Napi::CallbackInfo& info);
  Napi::Value Save(const Napi::CallbackInfo& info);
  Napi::Value SetReference(const Napi::CallbackInfo& info);
  Napi::Value ClearReference(const Napi::CallbackInfo& info);
  Napi::Value HasReference(const Napi::CallbackInfo& info);
  Napi::Value Trainable(const Napi::CallbackInfo& info);
  Napi::Value SetTrainable(const Napi::CallbackInfo& info);
};

}  // namespace slm_addon
