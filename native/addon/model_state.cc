// The state the four handles of a loaded model share (model_state.h): the leases that keep async
// calls from racing a change of the model (MODEL_BUSY), the native memory V8 is told about, dispose.
#include "addon/model_state.h"

#include <ATen/ATen.h>

#include "core/critic.h"

namespace slm_addon {

namespace {

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

ModelState::ModelState(std::shared_ptr<slm::Qwen3Model> m) : model(std::move(m)) {}

ModelState::~ModelState() {
  if (external_bytes != 0 && env) Napi::MemoryManagement::AdjustExternalMemory(Napi::Env(env), -external_bytes);
}

std::shared_ptr<slm::Qwen3Model> ModelState::live(Napi::Env env) const {
  if (!model) throw_error(env, "HANDLE_DISPOSED", "this model was disposed; load it again to use it.");
  return model;
}

Lease ModelState::lease(Napi::Env env, const char* what, bool writer) const {
  live(env);
  const int r = usage->readers.load(), w = usage->writers.load();
  if (w > 0 || (writer && r > 0))
    throw_error(env, "MODEL_BUSY",
                std::string(what) + ": the model is in use by " + std::to_string(r + w) + " running call(s) (" +
                    (w > 0 ? "a train step, an adapter or optimizer load" : "generation or forward passes") + "); await them before " +
                    (writer ? "changing the model." : "starting another call."));
  return Lease(usage, writer);
}

void ModelState::account(Napi::Env e) {
  int64_t now = caches ? caches->stats().bytes : 0;  // episode KV caches (outlive a disposed model only until dispose clears them)
  if (model)
    now += model->parameter_bytes() + adapter_bytes(*model) + (optimizer ? optimizer->bytes() : 0) +
           (critic_optimizer ? critic_optimizer->bytes() : 0);
  if (now != external_bytes) Napi::MemoryManagement::AdjustExternalMemory(e, now - external_bytes);
  external_bytes = now;
  env = e;
}

void ModelState::dispose(Napi::Env e) {
  model.reset();
  optimizer.reset();
  critic_optimizer.reset();
  vocab.reset();
  if (caches) caches->clear();
  account(e);
}

Napi::Object new_handle(Napi::Env env, const Napi::FunctionReference& cls, std::shared_ptr<ModelState> s) {
  auto* holder = new std::shared_ptr<ModelState>(std::move(s));
  auto ext = Napi::External<std::shared_ptr<ModelState>>::New(env, holder, [](Napi::Env, std::shared_ptr<ModelState>* p) { delete p; });
  return cls.New({ext});
}

}  // namespace slm_addon
