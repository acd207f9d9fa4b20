// Turning C++ failures into the JS SlmError class (handed over once by lib/binding at load time),
// so every native failure is catchable by `code`.
#pragma once
#include <napi.h>

#include <string>

namespace slm_addon {

// Per-environment state (one per Node thread that loads the addon).
struct InstanceData {
  Napi::FunctionReference error_class;
  // The classes of a loaded model's handles (model_state.h).
  Napi::FunctionReference model_class, adapter_set_class, value_head_class, optimizer_class;
};
InstanceData* data(Napi::Env env);

struct ErrorInfo {
  std::string code;
  std::string message;
};

// The JS error object for (code, message): an SlmError when the class was registered, else an Error
// with a `code` property.
Napi::Value make_error(Napi::Env env, const std::string& code, const std::string& message);
[[noreturn]] void throw_error(Napi::Env env, const std::string& code, const std::string& message);

// Runs `fn`, converting slm::EngineError, c10::Error and std::exception into ErrorInfo (for workers,
// whose Execute must not touch JS). Returns true on success.
template <class F>
bool capture(F&& fn, ErrorInfo& err);

void register_error_class(const Napi::CallbackInfo& info);

}  // namespace slm_addon

#include "addon/errors_impl.h"
