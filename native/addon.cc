// The addon's entry point: registers the N-API surface of the slm-train native engine (typed as a
// whole in lib/binding/types.ts) and defines its small process-wide calls (threads, version, the CPU
// kernels' switches, V8's external-memory count). The model's handles are in addon/model.h and the
// three beside it (model_state.h lists them), the kernels' test entry points in addon/kernels.cc,
// the losses in addon/losses.cc.
#include <napi.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/csrc/api/include/torch/version.h>

#include "addon/adapters.h"
#include "addon/errors.h"
#include "addon/model.h"
#include "addon/optimizer.h"
#include "addon/value_head.h"
#include "addon/workers.h"
#include "core/cpu_attention.h"
#include "core/cpu_cache.h"
#include "core/cpu_gemm.h"
#include "core/cpu_isa.h"
#include "core/cpu_norm.h"
#include "core/qwen3.h"

namespace slm_addon {
Napi::Value Measure(const Napi::CallbackInfo& info);
Napi::Object Losses(Napi::Env env);
// addon/kernels.cc
Napi::Value Linear(const Napi::CallbackInfo& info);
Napi::Value Sample(const Napi::CallbackInfo& info);
Napi::Value Attention(const Napi::CallbackInfo& info);
Napi::Value Norm(const Napi::CallbackInfo& info);
Napi::Value SiluMul(const Napi::CallbackInfo& info);
}  // namespace slm_addon

namespace {

// What tune_malloc did when the addon loaded (version().malloc).
std::string& malloc_policy() {
  static std::string s;
  return s;
}

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

// cpuCacheStats({release?}) -> {installed, cachedBytes, liveBytes, capBytes, hits, misses} of the
// CPU tensors' caching allocator (core/cpu_cache.h); release: true frees the cached blocks first.
Napi::Value CpuCacheStats(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (info[0].IsObject() && info[0].As<Napi::Object>().Get("release").ToBoolean().Value()) slm::cpu_cache_release();
  const auto s = slm::cpu_cache_stats();
  auto o = Napi::Object::New(env);
  o.Set("installed", Napi::Boolean::New(env, s.installed));
  o.Set("cachedBytes", Napi::Number::New(env, static_cast<double>(s.cached_bytes)));
  o.Set("liveBytes", Napi::Number::New(env, static_cast<double>(s.live_bytes)));
  o.Set("capBytes", Napi::Number::New(env, static_cast<double>(s.cap_bytes)));
  o.Set("hits", Napi::Number::New(env, static_cast<double>(s.hits)));
  o.Set("misses", Napi::Number::New(env, static_cast<double>(s.misses)));
  return o;
}

// The external memory V8 counts (Node-API's adjusted total; the model handles add theirs to it).
Napi::Value ExternalMemory(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(Napi::MemoryManagement::AdjustExternalMemory(info.Env(), 0)));
}

// Turns the CPU kernels (small-row linear layers, core/cpu_gemm.h; the fused sampler,
// core/sampler_cpu.h; attention, core/cpu_attention.h) off (false) or on (true): benchmarks measure both paths in one run, tests compare
// them.
Napi::Value SetCpuKernels(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsBoolean()) slm_addon::throw_error(env, "ARGUMENT_INVALID", "setCpuKernels expects true or false.");
  slm::set_cpu_kernels_enabled(info[0].As<Napi::Boolean>().Value());
  return env.Undefined();
}

// Caps the instruction set of the CPU kernels (core/cpu_isa.h): "avx512-bf16", "avx512", "avx2" or
// "none"; a level above the CPU's gives the CPU's. Returns the level now in force. For tests and
// benchmarks (users set SLM_TRAIN_CPU_ISA).
Napi::Value SetCpuIsa(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  slm::CpuIsa cap;
  if (!info[0].IsString() || !slm::parse_cpu_isa(info[0].As<Napi::String>().Utf8Value(), &cap))
    slm_addon::throw_error(env, "ARGUMENT_INVALID", "setCpuIsa expects one of avx512-bf16, avx512, avx2, none.");
  return Napi::String::New(env, slm::cpu_isa_name(slm::set_cpu_isa_cap(cap)));
}

// How often the fused norm / RoPE / SiLU-gate kernels ran in this process and over how many positions
// (core/cpu_norm.h): tests check with it that a prefill, not only a decode step, goes through them.
Napi::Value CpuNormCounts(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  const auto c = slm::cpu_norm_counts();
  auto o = Napi::Object::New(env);
  const auto put = [&](const char* name, const slm::CpuNormCount& k) {
    auto x = Napi::Object::New(env);
    x.Set("calls", Napi::Number::New(env, static_cast<double>(k.calls)));
    x.Set("positions", Napi::Number::New(env, static_cast<double>(k.positions)));
    o.Set(name, x);
  };
  put("rmsNorm", c.rms_norm);
  put("normRope", c.norm_rope);
  put("siluMul", c.silu_mul);
  return o;
}

Napi::Value Version(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto o = Napi::Object::New(env);
  o.Set("torch", Napi::String::New(env, TORCH_VERSION));
  o.Set("cuda", Napi::Boolean::New(env, at::hasCUDA()));
  o.Set("threads", Napi::Number::New(env, at::get_num_threads()));
  o.Set("config", Napi::String::New(env, at::show_config()));
  o.Set("parallel", Napi::String::New(env, at::get_parallel_info()));
  o.Set("smallLinear", Napi::String::New(env, slm::cpu_small_linear_isa()));
  o.Set("attentionKernel", Napi::String::New(env, slm::cpu_attention_isa()));
  o.Set("cpuIsa", Napi::String::New(env, slm::cpu_isa_name(slm::cpu_isa())));
  o.Set("cpuIsaDetected", Napi::String::New(env, slm::cpu_isa_name(slm::cpu_isa_detected())));
  o.Set("napi", Napi::Number::New(env, NAPI_VERSION));
  o.Set("malloc", Napi::String::New(env, malloc_policy()));
  o.Set("cpuCache", Napi::String::New(env, slm::install_cpu_cache()));
  return o;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  malloc_policy() = slm_addon::tune_malloc();
  slm::install_cpu_cache();
  exports.Set("setErrorClass", Napi::Function::New(env, SetErrorClass));
  exports.Set("setThreads", Napi::Function::New(env, SetThreads));
  exports.Set("version", Napi::Function::New(env, Version));
  exports.Set("setCpuKernels", Napi::Function::New(env, SetCpuKernels));
  exports.Set("setCpuIsa", Napi::Function::New(env, SetCpuIsa));
  exports.Set("linear", Napi::Function::New(env, slm_addon::Linear));
  exports.Set("sample", Napi::Function::New(env, slm_addon::Sample));
  exports.Set("attention", Napi::Function::New(env, slm_addon::Attention));
  exports.Set("norm", Napi::Function::New(env, slm_addon::Norm));
  exports.Set("siluMul", Napi::Function::New(env, slm_addon::SiluMul));
  exports.Set("losses", slm_addon::Losses(env));
  exports.Set("externalMemory", Napi::Function::New(env, ExternalMemory));
  exports.Set("cpuCacheStats", Napi::Function::New(env, CpuCacheStats));
  exports.Set("cpuNormCounts", Napi::Function::New(env, CpuNormCounts));
  exports.Set("measure", Napi::Function::New(env, slm_addon::Measure));
  exports.Set("loadModel", Napi::Function::New(env, slm_addon::ModelWrap::Load));
  exports.Set("NativeModel", slm_addon::ModelWrap::Define(env));
  exports.Set("NativeAdapterSet", slm_addon::AdapterSetWrap::Define(env));
  exports.Set("NativeValueHead", slm_addon::ValueHeadWrap::Define(env));
  exports.Set("NativeOptimizer", slm_addon::OptimizerWrap::Define(env));
  return exports;
}

}  // namespace

NODE_API_MODULE(slm_train, Init)
