// PPO's separate critic on NativeModel (core/critic.h): a second LoRA adapter on the same frozen
// base weights, trained with its own AdamW (ModelWrap::critic_optimizer_), saved beside the actor's
// adapter (saveLora's criticFile) and in the optimizer file under "critic/" names.
#include <ATen/ATen.h>

#include <functional>

#include "addon/convert.h"
#include "addon/model.h"
#include "addon/workers.h"
#include "core/critic.h"
#include "core/safetensors.h"

namespace slm_addon {

namespace {
const std::string kCriticPrefix = "critic/";  // the critic optimizer's entries in the optimizer file
}  // namespace

// A synchronous change of the critic adapter: refused while a call runs, a fresh critic optimizer,
// the native bytes re-counted.
Napi::Value ModelWrap::ChangeCritic(Napi::Env env, const char* what, const std::function<void(slm::Qwen3Model&)>& change) {
  auto m = live(env);
  idle(env, what);
  ErrorInfo err;
  if (!capture([&] { change(*m); }, err)) throw_error(env, err.code, err.message);
  critic_optimizer_ = std::make_shared<slm::AdamW>();
  account(env);
  return env.Undefined();
}

// attachCritic(): a critic adapter equal to the actor's adapter now.
Napi::Value ModelWrap::AttachCritic(const Napi::CallbackInfo& info) { return ChangeCritic(info.Env(), "attachCritic", slm::attach_critic); }

// loadCritic(file): the critic adapter from critic_adapter.safetensors (after the actor's adapter).
Napi::Value ModelWrap::LoadCritic(const Napi::CallbackInfo& info) {
  if (!info[0].IsString()) throw_error(info.Env(), "ARGUMENT_INVALID", "loadCritic expects the path of a critic_adapter.safetensors file.");
  const auto file = info[0].As<Napi::String>().Utf8Value();
  return ChangeCritic(info.Env(), "loadCritic", [&file](slm::Qwen3Model& m) { slm::load_critic(m, slm::read_safetensors_files({file})); });
}

// detachCritic(): the critic shares the actor's adapter again (the value head stays).
Napi::Value ModelWrap::DetachCritic(const Napi::CallbackInfo& info) { return ChangeCritic(info.Env(), "detachCritic", slm::detach_critic); }

Napi::Value ModelWrap::HasCritic(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), live(info.Env())->has_critic()); }

// The optimizer file's tensors: the actor's AdamW state, and the critic's under "critic/" names.
std::map<std::string, at::Tensor> optimizer_state(const slm::AdamW& actor, const slm::AdamW* critic) {
  auto s = actor.state();
  if (critic && critic->step > 0)
    for (auto& [k, t] : critic->state()) s[kCriticPrefix + k] = t;
  return s;
}

// The inverse: the "critic/" entries to the critic's AdamW (fresh when there are none), the rest to the actor's.
void load_optimizer_state(std::map<std::string, at::Tensor>&& s, slm::AdamW& actor, slm::AdamW& critic, const at::Device& dev) {
  std::map<std::string, at::Tensor> c;
  for (auto it = s.begin(); it != s.end();) {
    if (it->first.rfind(kCriticPrefix, 0) == 0) {
      c[it->first.substr(kCriticPrefix.size())] = it->second;
      it = s.erase(it);
    } else {
      ++it;
    }
  }
  actor.load(s, dev);
  if (c.empty())
    critic = slm::AdamW();
  else
    critic.load(c, dev);
}

}  // namespace slm_addon
