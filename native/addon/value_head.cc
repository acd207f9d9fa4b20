// NativeValueHead (value_head.h): the value head, PPO's separate critic (core/critic.h: trained with
// its own AdamW, ModelState::critic_optimizer; saved beside the actor's adapter by adapters.save's
// criticFile, and in the optimizer file under "critic/" names, optimizer.cc) and the values.
#include "addon/value_head.h"

#include <ATen/ATen.h>

#include "addon/convert.h"
#include "addon/model.h"
#include "addon/workers.h"
#include "core/critic.h"
#include "core/safetensors.h"

namespace slm_addon {

Napi::Function ValueHeadWrap::Define(Napi::Env env) {
  auto cls =
      DefineClass(env, kName,
                  {InstanceMethod<&ValueHeadWrap::Attach>("attach"), InstanceMethod<&ValueHeadWrap::Load>("load"),
                   InstanceMethod<&ValueHeadWrap::Values>("values"), InstanceMethod<&ValueHeadWrap::AttachCritic>("attachCritic"),
                   InstanceMethod<&ValueHeadWrap::LoadCritic>("loadCritic"), InstanceMethod<&ValueHeadWrap::DetachCritic>("detachCritic"),
                   InstanceMethod<&ValueHeadWrap::HasCritic>("hasCritic")});
  data(env)->value_head_class = Napi::Persistent(cls);
  return cls;
}

// attach(seed?): a fresh value head in place of the one attached.
Napi::Value ValueHeadWrap::Attach(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->idle(env, "attachValueHead");
  m->value_head = slm::ValueHead::fresh(m->config().hidden_size, m->device(),
                                        static_cast<uint64_t>(info[0].IsNumber() ? info[0].As<Napi::Number>().Int64Value() : 0));
  s_->account(env);
  return env.Undefined();
}

// load(file): the value head from value_head.safetensors.
Napi::Value ValueHeadWrap::Load(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->idle(env, "loadValueHead");
  auto file = info[0].As<Napi::String>().Utf8Value();
  ErrorInfo err;
  if (!capture([&] { m->value_head = slm::ValueHead::load(slm::read_safetensors_files({file}), m->config().hidden_size, m->device()); },
               err))
    throw_error(env, err.code, err.message);
  s_->account(env);
  return env.Undefined();
}

// values({ids, lengths}) -> Promise<Float32Array>: the value of the state before every token (the
// separate critic's forward when attached, else the actor's).
Napi::Value ValueHeadWrap::Values(const Napi::CallbackInfo& info) {
  auto m = s_->live(info.Env());
  if (!m->value_head.defined())
    throw_error(info.Env(), "NOT_SUPPORTED",
                "values: no value head is attached; call attachValueHead() or load an adapter saved with one.");
  return queue_rows(info, m, s_->lease(info.Env(), "sequenceValues", false), "sequenceValues", Rows::Values);
}

Napi::Value ValueHeadWrap::ChangeCritic(Napi::Env env, const char* what, const std::function<void(slm::Qwen3Model&)>& change) {
  auto m = s_->live(env);
  s_->idle(env, what);
  ErrorInfo err;
  if (!capture([&] { change(*m); }, err)) throw_error(env, err.code, err.message);
  s_->critic_optimizer = std::make_shared<slm::AdamW>();
  s_->account(env);
  return env.Undefined();
}

// attachCritic(): a critic adapter equal to the actor's adapter now.
Napi::Value ValueHeadWrap::AttachCritic(const Napi::CallbackInfo& info) {
  return ChangeCritic(info.Env(), "attachCritic", slm::attach_critic);
}

// loadCritic(file): the critic adapter from critic_adapter.safetensors (after the actor's adapter).
Napi::Value ValueHeadWrap::LoadCritic(const Napi::CallbackInfo& info) {
  if (!info[0].IsString()) throw_error(info.Env(), "ARGUMENT_INVALID", "loadCritic expects the path of a critic_adapter.safetensors file.");
  const auto file = info[0].As<Napi::String>().Utf8Value();
  return ChangeCritic(info.Env(), "loadCritic", [&file](slm::Qwen3Model& m) { slm::load_critic(m, slm::read_safetensors_files({file})); });
}

// detachCritic(): the critic shares the actor's adapter again (the value head stays).
Napi::Value ValueHeadWrap::DetachCritic(const Napi::CallbackInfo& info) {
  return ChangeCritic(info.Env(), "detachCritic", slm::detach_critic);
}

Napi::Value ValueHeadWrap::HasCritic(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), s_->live(info.Env())->has_critic());
}

}  // namespace slm_addon
