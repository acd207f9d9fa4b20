#include "addon/errors.h"

namespace slm_addon {

InstanceData* data(Napi::Env env) {
  auto* d = env.GetInstanceData<InstanceData>();
  if (!d) {
    d = new InstanceData();
    env.SetInstanceData(d);
  }
  return d;
}

Napi::Value make_error(Napi::Env env, const std::string& code, const std::string& message) {
  auto* d = data(env);
  if (!d->error_class.IsEmpty()) {
    return d->error_class.New({Napi::String::New(env, code), Napi::String::New(env, message)});
  }
  auto e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  return e.Value();
}

void throw_error(Napi::Env env, const std::string& code, const std::string& message) {
  throw Napi::Error(env, make_error(env, code, message));
}

void register_error_class(const Napi::CallbackInfo& info) {
  if (!info[0].IsFunction()) throw Napi::TypeError::New(info.Env(), "setErrorClass expects a class");
  data(info.Env())->error_class = Napi::Persistent(info[0].As<Napi::Function>());
}

}  // namespace slm_addon
