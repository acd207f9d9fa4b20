// NativeAdapterSet (adapters.h): the LoRA adapter, the KL reference adapter, the trainable tensors'
// values. Attaching, loading or detaching an adapter starts the optimizer afresh (optimizer.cc).
#include "addon/adapters.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/critic.h"
#include "core/lora.h"
#include "core/safetensors.h"

namespace slm_addon {

namespace {

slm::LoraConfig read_lora(Napi::Env env, const Napi::Object& o) {
  // r, alpha and dropout are the caller's (lib/engine/adapter.ts LoraSpec; the config schema has the defaults).
  slm::LoraConfig c;
  c.r = int_field(env, o, "r", 0, true);
  for (const char* k : {"alpha", "dropout"})
    if (!o.Get(k).IsNumber())
      throw_error(env, "ARGUMENT_INVALID", std::string("LoRA config: '") + k + "' must be a number; pass the adapter's value.");
  c.alpha = num_field(env, o, "alpha", 0);
  c.dropout = num_field(env, o, "dropout", 0);
  auto rs = o.Get("rslora");
  c.rslora = rs.IsBoolean() && rs.As<Napi::Boolean>().Value();
  auto t = o.Get("targets");
  if (!t.IsArray()) throw_error(env, "ARGUMENT_INVALID", "LoRA config: 'targets' must be an array of module names.");
  auto ta = t.As<Napi::Array>();
  for (uint32_t i = 0; i < ta.Length(); ++i) c.targets.push_back(ta.Get(i).As<Napi::String>().Utf8Value());
  auto l = o.Get("layers");
  if (l.IsArray()) {
    auto la = l.As<Napi::Array>();
    for (uint32_t i = 0; i < la.Length(); ++i) c.layers.push_back(la.Get(i).As<Napi::Number>().Int64Value());
  }
  return c;
}

}  // namespace

Napi::Function AdapterSetWrap::Define(Napi::Env env) {
  auto cls = DefineClass(
      env, kName,
      {InstanceMethod<&AdapterSetWrap::Attach>("attach"), InstanceMethod<&AdapterSetWrap::Load>("load"),
       InstanceMethod<&AdapterSetWrap::Detach>("detach"), InstanceMethod<&AdapterSetWrap::Save>("save"),
       InstanceMethod<&AdapterSetWrap::SetReference>("setReference"), InstanceMethod<&AdapterSetWrap::ClearReference>("clearReference"),
       InstanceMethod<&AdapterSetWrap::HasReference>("hasReference"), InstanceMethod<&AdapterSetWrap::Trainable>("trainable"),
       InstanceMethod<&AdapterSetWrap::SetTrainable>("setTrainable")});
  data(env)->adapter_set_class = Napi::Persistent(cls);
  return cls;
}

// attach({r, alpha, dropout, rslora, targets, layers?, seed?}): a fresh adapter (B = 0: the model
// starts at the base) in place of the one attached.
Napi::Value AdapterSetWrap::Attach(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->idle(env, "attachLora");
  auto c = read_lora(env, info[0].As<Napi::Object>());
  const auto seed = static_cast<uint64_t>(num_field(env, info[0].As<Napi::Object>(), "seed", 0));
  ErrorInfo err;
  if (!capture([&] { slm::attach_lora(*m, c, seed); }, err)) throw_error(env, err.code, err.message);
  s_->optimizer = std::make_shared<slm::AdamW>();
  s_->account(env);
  return env.Undefined();
}

// load({...spec, file}) -> Promise: a PEFT adapter_model.safetensors of that spec, on a worker thread.
Napi::Value AdapterSetWrap::Load(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  auto o = info[0].As<Napi::Object>();
  auto c = read_lora(env, o);
  auto file = str_field(env, o, "file", "");
  auto l = s_->lease(env, "loadLora", true);
  s_->optimizer = std::make_shared<slm::AdamW>();
  return LambdaWorker::Start(
      env, "slm:loadLora", info.This().As<Napi::Object>(), [m, c, file] { slm::load_lora(*m, c, slm::read_safetensors_files({file})); },
      [s = s_](Napi::Env e) {
        s->account(e);
        return e.Undefined();
      },
      std::move(l));
}

// setReference(): freeze the adapter attached now as the KL reference policy;
// clearReference(): the reference is the base model again; hasReference() -> boolean.
Napi::Value AdapterSetWrap::SetReference(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->idle(env, "setReferenceAdapter");
  ErrorInfo err;
  if (!capture([&] { slm::set_reference_adapter(*m); }, err)) throw_error(env, err.code, err.message);
  s_->account(env);
  return env.Undefined();
}

Napi::Value AdapterSetWrap::ClearReference(const Napi::CallbackInfo& info) {
  s_->idle(info.Env(), "clearReferenceAdapter");
  slm::clear_reference_adapter(*s_->live(info.Env()));
  s_->account(info.Env());
  return info.Env().Undefined();
}

Napi::Value AdapterSetWrap::HasReference(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), slm::has_reference_adapter(*s_->live(info.Env())));
}

// detach(): the bare base model: no adapter, no separate critic, no value head, fresh optimizers.
Napi::Value AdapterSetWrap::Detach(const Napi::CallbackInfo& info) {
  auto m = s_->live(info.Env());
  s_->idle(info.Env(), "detachLora");
  slm::detach_lora(*m);
  slm::detach_critic(*m);
  m->value_head = slm::ValueHead();
  s_->optimizer = std::make_shared<slm::AdamW>();
  s_->critic_optimizer = std::make_shared<slm::AdamW>();
  s_->account(info.Env());
  return info.Env().Undefined();
}

// save({file, valueHeadFile?, criticFile?}) -> Promise: the adapter in PEFT names, and the value head
// and the separate critic's adapter beside it when they exist.
Napi::Value AdapterSetWrap::Save(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  auto o = info[0].As<Napi::Object>();
  auto file = str_field(env, o, "file", "");
  auto value_file = str_field(env, o, "valueHeadFile", "");
  auto critic_file = str_field(env, o, "criticFile", "");
  return LambdaWorker::Start(
      env, "slm:saveLora", info.This().As<Napi::Object>(),
      [m, file, value_file, critic_file] {
        slm::write_safetensors(file, slm::lora_tensors(*m), {{"format", "pt"}});
        if (!value_file.empty() && m->value_head.defined()) slm::write_safetensors(value_file, m->value_head.tensors(), {{"format", "pt"}});
        if (!critic_file.empty() && m->has_critic()) slm::write_safetensors(critic_file, slm::critic_tensors(*m), {{"format", "pt"}});
      },
      [](Napi::Env e) { return e.Undefined(); }, s_->lease(env, "saveLora", false));
}

// trainable({grad}) -> {name: Float32Array} copies of the trainable tensors (or their gradients).
Napi::Value AdapterSetWrap::Trainable(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->not_writing(env, "trainable");
  const bool grad = info[0].IsObject() && bool_field(info[0].As<Napi::Object>(), "grad", false);
  auto out = Napi::Object::New(env);
  for (const auto& [name, p] : slm::trainable(*m)) {
    at::Tensor t = grad ? p.grad() : p;
    if (!t.defined()) continue;
    auto c = t.detach().to(at::kCPU, at::kFloat).contiguous();
    auto a = Napi::Float32Array::New(env, c.numel());
    std::memcpy(a.Data(), c.data_ptr<float>(), c.numel() * sizeof(float));
    out.Set(name, a);
  }
  return out;
}

// setTrainable(name, Float32Array): overwrite one trainable tensor (tests, distributed sync).
Napi::Value AdapterSetWrap::SetTrainable(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->idle(env, "setTrainable");
  auto name = info[0].As<Napi::String>().Utf8Value();
  auto vals = float32s(env, info[1], "values");
  for (const auto& [n, p] : slm::trainable(*m)) {
    if (n != name) continue;
    if (static_cast<int64_t>(vals.size()) != p.numel())
      throw_error(env, "ARGUMENT_INVALID", "setTrainable: " + name + " has " + std::to_string(p.numel()) + " values.");
    at::NoGradGuard ng;
    p.detach().copy_(at::tensor(vals, at::kFloat).view(p.sizes()));
    return env.Undefined();
  }
  throw_error(env, "ARGUMENT_INVALID", "no trainable tensor named '" + name + "'.");
}

}  // namespace slm_addon
