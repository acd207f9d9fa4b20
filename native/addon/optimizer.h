// The JS `NativeOptimizer` class (model.optimizer): training a loaded model's trainable tensors. One
// train step in one call (forward, backward, clipping, AdamW), or its halves for data-parallel ranks
// (a step with update: false, the flat gradients, applyGradients on the all-reduced ones), and the
// AdamW state of the actor and of the separate critic (save / load one file). Shares the model's
// state (model_state.h): ModelState::optimizer and critic_optimizer, restarted by adapters.attach /
// load / detach and the critic's changes.
#pragma once
#include <napi.h>

#include "addon/model_state.h"

namespace slm_addon {

class OptimizerWrap : public StateWrap<OptimizerWrap> {
 public:
  static constexpr const char* kName = "NativeOptimizer";
  static Napi::Function Define(Napi::Env env);
  using StateWrap<OptimizerWrap>::StateWrap;

 private:
  Napi::Value TrainStep(const Napi::CallbackInfo& info);
  Napi::Value Gradients(const Napi::CallbackInfo& info);
  Napi::Value ApplyGradients(const Napi::CallbackInfo& info);
  Napi::Value Save(const Napi::CallbackInfo& info);
  Napi::Value Load(const Napi::CallbackInfo& info);
};

}  // namespace slm_addon
