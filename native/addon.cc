// Registration only: the N-API surface of the slm-train native engine. The whole surface is typed in
// lib/binding/types.ts.
#include <napi.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/csrc/api/include/torch/version.h>

#include "addon/errors.h"
#include "addon/model.h"

namespace slm_addon {
Napi::Value Measure(const Napi::CallbackInfo& info);
Napi::Object Losses(Napi::Env env);
}

namespace {

Napi::Value SetErrorClass(const Napi::CallbackInfo& info) {
  slm_addon::register_error_class(info);
  return info.Env().Undefined();
}

Napi::Value SetThreads(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsNumber() || info[0].As<Napi::Number>().Int32Value() < 1)
    slm_addon::throw_error(env, "ARGUMENT_INVALID", "setThreads expects a positive integer.");
  at::set_num_threads(info[0].As<Napi::Number>().Int32Value());
  return env.Undefined();
}

// The external memory V8 counts (Node-API's adjusted total; the model handles add theirs to it).
Napi::Value ExternalMemory(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(Napi::MemoryManagement::AdjustExternalMemory(info.Env(), 0)));
}

Napi::Value Version(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = Napi::Object::New(env);
  o.Set("torch", Napi::String::New(env, TORCH_VERSION));
  o.Set("cuda", Napi::Boolean::New(env, at::hasCUDA()));
  o.Set("threads", Napi::Number::New(env, at::get_num_threads()));
  o.Set("config", Napi::String::New(env, at::show_config()));
  o.Set("parallel", Napi::String::New(env, at::get_parallel_info()));
  o.Set("napi", Napi::Number::New(env, NAPI_VERSION));
  return o;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("setErrorClass", Napi::Function::New(env, SetErrorClass));
  exports.Set("setThreads", Napi::Function::New(env, SetThreads));
  exports.Set("version", Napi::Function::New(env, Version));
  exports.Set("losses", slm_addon::Losses(env));
  exports.Set("externalMemory", Napi::Function::New(env, ExternalMemory));
  exports.Set("measure", Napi::Function::New(env, slm_addon::Measure));
  exports.Set("loadModel", Napi::Function::New(env, slm_addon::ModelWrap::Load));
  exports.Set("NativeModel", slm_addon::ModelWrap::Define(env));
  return exports;
}

}  // namespace

NODE_API_MODULE(slm_train, Init)
