// The LoRA training surface of NativeModel: adapters (attach, PEFT load/save, merge), the value head,
// one-call training steps and optimizer state. Long calls run on worker threads.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <cstring>

#include "addon/convert.h"
#include "addon/model.h"
#include "addon/workers.h"
#include "core/critic.h"
#include "core/lora.h"
#include "core/train.h"
#include "core/safetensors.h"

namespace slm_addon {

namespace {

slm::LoraConfig read_lora(Napi::Env env, const Napi::Object& o) {
  // r, alpha and dropout are the caller's (lib/engine/adapter.ts LoraSpec; the config schema has the defaults).
  slm::LoraConfig c;
  c.r = int_field(env, o, "r", 0, true);
  for (const char* k : {"alpha", "dropout"})
    if (!o.Get(k).IsNumber()) throw_error(env, "ARGUMENT_INVALID", std::string("LoRA config: '") + k + "' must be a number; pass the adapter's value.");
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

bool bool_field(const Napi::Object& o, const char* k, bool dflt) {
  auto v = o.Get(k);
  return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : dflt;
}

// The optimizer's numbers. Their defaults are torch.optim.AdamW's and equal lib/config/schema.ts's
// (test/native-losses.test.ts asserts it); the trainers pass every one.
slm::OptimConfig read_optim(Napi::Env env, const Napi::Object& o) {
  slm::OptimConfig oc;
  oc.lr = num_field(env, o, "lr", 1e-4);
  oc.value_lr = num_field(env, o, "valueLr", -1);
  oc.beta1 = num_field(env, o, "beta1", 0.9);
  oc.beta2 = num_field(env, o, "beta2", 0.999);
  oc.eps = num_field(env, o, "eps", 1e-8);
  oc.weight_decay = num_field(env, o, "weightDecay", 0);
  oc.max_grad_norm = num_field(env, o, "maxGradNorm", 1.0);
  oc.critic_max_grad_norm = num_field(env, o, "criticMaxGradNorm", -1);  // the separate critic's clip; absent: maxGradNorm
  return oc;
}

Napi::Object stats_to_js(Napi::Env env, const slm::TrainStats& s) {
  auto o = Napi::Object::New(env);
  o.Set("loss", s.loss);
  o.Set("pgLoss", s.pg_loss);
  o.Set("sftLoss", s.sft_loss);
  o.Set("kl", s.kl);
  o.Set("entropy", s.entropy);
  o.Set("clipFrac", s.clip_frac);
  o.Set("ratio", s.ratio);
  o.Set("valueLoss", s.value_loss);
  o.Set("gradNorm", s.grad_norm);
  o.Set("criticGradNorm", s.critic_grad_norm);
  o.Set("tokens", static_cast<double>(s.tokens));
  o.Set("sequences", static_cast<double>(s.sequences));
  o.Set("headRows", static_cast<double>(s.head_rows));
  o.Set("skipped", s.skipped);
  o.Set("skipReason", s.skip_reason);
  return o;
}

// A number the caller must pass (no native default: lib/config/schema.ts holds it).
double required_num(Napi::Env env, const Napi::Object& o, const char* k, const char* why) {
  auto v = o.Get(k);
  if (!v.IsNumber())
    throw_error(env, "ARGUMENT_INVALID", std::string("trainStep: '") + k + "' is required " + why + ", found " + (v.IsUndefined() ? "nothing" : "a non-number") + "; pass the configured value (lib/config/schema.ts has the defaults).");
  return v.As<Napi::Number>().DoubleValue();
}

}  // namespace

Napi::Value ModelWrap::AttachLora(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  idle(env, "attachLora");
  auto c = read_lora(env, info[0].As<Napi::Object>());
  const auto seed = static_cast<uint64_t>(num_field(env, info[0].As<Napi::Object>(), "seed", 0));
  ErrorInfo err;
  if (!capture([&] { slm::attach_lora(*m, c, seed); }, err)) throw_error(env, err.code, err.message);
  optimizer_ = std::make_shared<slm::AdamW>();
  account(env);
  return env.Undefined();
}

Napi::Value ModelWrap::LoadLora(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  auto o = info[0].As<Napi::Object>();
  auto c = read_lora(env, o);
  auto file = str_field(env, o, "file", "");
  auto l = lease(env, "loadLora", true);
  optimizer_ = std::make_shared<slm::AdamW>();
  return LambdaWorker::Start(
      env, "slm:loadLora", info.This().As<Napi::Object>(), [m, c, file] { slm::load_lora(*m, c, slm::read_safetensors_files({file})); },
      [this](Napi::Env e) {
        account(e);
        return e.Undefined();
      },
      std::move(l));
}

// setReferenceAdapter(): freeze the adapter attached now as the KL reference policy;
// clearReferenceAdapter(): the reference is the base model again; hasReferenceAdapter() -> boolean.
Napi::Value ModelWrap::SetReferenceAdapter(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  idle(env, "setReferenceAdapter");
  ErrorInfo err;
  if (!capture([&] { slm::set_reference_adapter(*m); }, err)) throw_error(env, err.code, err.message);
  account(env);
  return env.Undefined();
}

Napi::Value ModelWrap::ClearReferenceAdapter(const Napi::CallbackInfo& info) {
  idle(info.Env(), "clearReferenceAdapter");
  slm::clear_reference_adapter(*live(info.Env()));
  account(info.Env());
  return info.Env().Undefined();
}

Napi::Value ModelWrap::HasReferenceAdapter(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), slm::has_reference_adapter(*live(info.Env())));
}

Napi::Value ModelWrap::DetachLora(const Napi::CallbackInfo& info) {
  auto m = live(info.Env());
  idle(info.Env(), "detachLora");
  slm::detach_lora(*m);
  slm::detach_critic(*m);
  m->value_head = slm::ValueHead();
  optimizer_ = std::make_shared<slm::AdamW>();
  critic_optimizer_ = std::make_shared<slm::AdamW>();
  account(info.Env());
  return info.Env().Undefined();
}

Napi::Value ModelWrap::SaveLora(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
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
      [](Napi::Env e) { return e.Undefined(); }, lease(env, "saveLora", false));
}

Napi::Value ModelWrap::AttachValueHead(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  idle(env, "attachValueHead");
  m->value_head = slm::ValueHead::fresh(m->config().hidden_size, m->device(), static_cast<uint64_t>(info[0].IsNumber() ? info[0].As<Napi::Number>().Int64Value() : 0));
  account(env);
  return env.Undefined();
}

Napi::Value ModelWrap::LoadValueHead(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  idle(env, "loadValueHead");
  auto file = info[0].As<Napi::String>().Utf8Value();
  ErrorInfo err;
  if (!capture([&] { m->value_head = slm::ValueHead::load(slm::read_safetensors_files({file}), m->config().hidden_size, m->device()); }, err))
    throw_error(env, err.code, err.message);
  account(env);
  return env.Undefined();
}

Napi::Value ModelWrap::TrainStep(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "trainStep expects a batch object.");
  auto o = info[0].As<Napi::Object>();
  auto lengths = int32s(env, o.Get("lengths"), "lengths");
  auto ids = int32s(env, o.Get("ids"), "ids");
  size_t total = 0;
  for (auto n : lengths) total += static_cast<size_t>(n);
  if (total != ids.size()) throw_error(env, "ARGUMENT_INVALID", "lengths add up to " + std::to_string(total) + " but " + std::to_string(ids.size()) + " ids were given.");
  slm::TrainBatch b;
  size_t off = 0;
  for (auto n : lengths) {
    b.seqs.emplace_back(ids.begin() + off, ids.begin() + off + n);
    off += n;
  }
  b.mask = rows_of<uint8_t, napi_uint8_array>(env, o, "mask", lengths, total);
  b.advantages = rows_of<float, napi_float32_array>(env, o, "advantages", lengths, total);
  b.old_logprobs = rows_of<float, napi_float32_array>(env, o, "oldLogprobs", lengths, total);
  b.returns = rows_of<float, napi_float32_array>(env, o, "returns", lengths, total);
  b.old_values = rows_of<float, napi_float32_array>(env, o, "oldValues", lengths, total);
  b.entropy_scale = rows_of<float, napi_float32_array>(env, o, "entropyScale", lengths, total);
  if (!o.Get("temperature").IsUndefined()) b.temperature = float32s(env, o.Get("temperature"), "temperature");
  if (!b.temperature.empty() && b.temperature.size() != b.seqs.size()) throw_error(env, "ARGUMENT_INVALID", "temperature must have one value per sequence.");
  slm::LossConfig lc;
  auto kind = str_field(env, o, "loss", "sft");
  if (kind != "sft" && kind != "pg") throw_error(env, "ARGUMENT_INVALID", "loss must be 'sft' or 'pg', found '" + kind + "'.");
  lc.kind = kind == "pg" ? slm::LossKind::PG : slm::LossKind::SFT;
  if (lc.kind == slm::LossKind::PG) {
    lc.clip_low = required_num(env, o, "clipLow", "for the policy loss (loss 'pg')");
    lc.clip_high = num_field(env, o, "clipHigh", lc.clip_low);  // absent: symmetric clipping
  }
  lc.token_level = bool_field(o, "tokenLevel", true);
  lc.kl_coef = num_field(env, o, "klCoef", 0);
  if (lc.kind == slm::LossKind::PG && lc.kl_coef > 0) {
    lc.kl_estimator = static_cast<int>(required_num(env, o, "klEstimator", "when klCoef > 0"));
    if (lc.kl_estimator != 1 && lc.kl_estimator != 3) throw_error(env, "ARGUMENT_INVALID", "klEstimator must be 1 (k1) or 3 (k3), found " + std::to_string(lc.kl_estimator) + ".");
  }
  lc.entropy_coef = num_field(env, o, "entropyCoef", 0);
  lc.old_from_forward = bool_field(o, "oldFromForward", false);
  lc.vf_coef = num_field(env, o, "vfCoef", 0);
  if (lc.vf_coef > 0) lc.value_clip = required_num(env, o, "valueClip", "when vfCoef > 0 (the value loss is on)");
  auto oc = read_optim(env, o);
  slm::TrainOptions to;
  to.micro_batch = int_field(env, o, "microBatch", 0);
  to.checkpoint = bool_field(o, "checkpoint", true);
  to.update = bool_field(o, "update", true);
  to.norm_tokens = int_field(env, o, "normTokens", 0);
  to.norm_sequences = int_field(env, o, "normSequences", 0);
  auto seed = o.Get("seed");
  if (!seed.IsUndefined()) {
    if (!seed.IsNumber() || !std::isfinite(seed.As<Napi::Number>().DoubleValue()))
      throw_error(env, "ARGUMENT_INVALID", "trainStep: seed must be an integer (it seeds LoRA dropout for this step), or absent.");
    to.seed = static_cast<uint64_t>(seed.As<Napi::Number>().Int64Value());  // as torch.manual_seed: negative seeds wrap
  }
  auto l = lease(env, "trainStep", true);
  auto opt = optimizer_;
  auto copt = critic_optimizer_;
  auto stats = std::make_shared<slm::TrainStats>();
  return LambdaWorker::Start(
      env, "slm:trainStep", info.This().As<Napi::Object>(), [m, opt, copt, b, lc, oc, to, stats] { *stats = slm::train_step(*m, *opt, b, lc, oc, to, copt.get()); },
      [this, stats, opt](Napi::Env e) {
        account(e);
        auto r = stats_to_js(e, *stats);
        r.Set("step", static_cast<double>(opt->step));
        return r;
      },
      std::move(l));
}

Napi::Value ModelWrap::SaveOptimizer(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  live(env);
  auto file = info[0].As<Napi::String>().Utf8Value();
  auto opt = optimizer_;
  auto copt = critic_optimizer_;
  return LambdaWorker::Start(env, "slm:saveOptimizer", info.This().As<Napi::Object>(), [opt, copt, file] { slm::write_safetensors(file, optimizer_state(*opt, copt.get())); },
                             [](Napi::Env e) { return e.Undefined(); }, lease(env, "saveOptimizer", false));
}

Napi::Value ModelWrap::LoadOptimizer(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  auto file = info[0].As<Napi::String>().Utf8Value();
  auto l = lease(env, "loadOptimizer", true);
  auto opt = optimizer_;
  auto copt = critic_optimizer_;
  return LambdaWorker::Start(
      env, "slm:loadOptimizer", info.This().As<Napi::Object>(),
      [m, opt, copt, file] {
        auto t = slm::read_safetensors_files({file});
        load_optimizer_state(std::move(t.tensors), *opt, *copt, m->device());
      },
      [this](Napi::Env e) {
        account(e);
        return e.Undefined();
      },
      std::move(l));
}

Napi::Value ModelWrap::SaveMerged(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  auto o = info[0].As<Napi::Object>();
  auto file = str_field(env, o, "file", "");
  auto dtype_s = str_field(env, o, "dtype", "float32");
  ErrorInfo err;
  at::ScalarType dtype = at::kFloat;
  if (!capture([&] { dtype = slm::parse_compute_dtype(dtype_s); }, err)) throw_error(env, err.code, err.message);
  return LambdaWorker::Start(
      env, "slm:saveMerged", info.This().As<Napi::Object>(), [m, file, dtype] { slm::write_safetensors(file, slm::merged_weights(*m, dtype), {{"format", "pt"}}); },
      [](Napi::Env e) { return e.Undefined(); }, lease(env, "saveMerged", false));
}

// trainable({grad}) -> {name: Float32Array} copies of the trainable tensors (or their gradients).
Napi::Value ModelWrap::Trainable(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  not_writing(env, "trainable");
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
Napi::Value ModelWrap::SetTrainable(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  idle(env, "setTrainable");
  auto name = info[0].As<Napi::String>().Utf8Value();
  auto vals = float32s(env, info[1], "values");
  for (const auto& [n, p] : slm::trainable(*m)) {
    if (n != name) continue;
    if (static_cast<int64_t>(vals.size()) != p.numel()) throw_error(env, "ARGUMENT_INVALID", "setTrainable: " + name + " has " + std::to_string(p.numel()) + " values.");
    at::NoGradGuard ng;
    p.detach().copy_(at::tensor(vals, at::kFloat).view(p.sizes()));
    return env.Undefined();
  }
  throw_error(env, "ARGUMENT_INVALID", "no trainable tensor named '" + name + "'.");
}

// gradients() -> Float32Array: every trainable tensor's gradient flattened in trainable() order (zeros
// where none), e.g. after trainStep({update: false}), for an all-reduce across data-parallel ranks.
Napi::Value ModelWrap::Gradients(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  not_writing(env, "gradients");
  at::Tensor g;
  ErrorInfo err;
  if (!capture([&] { g = slm::flat_gradients(*m).to(at::kCPU).contiguous(); }, err)) throw_error(env, err.code, err.message);
  auto a = Napi::Float32Array::New(env, g.numel());
  std::memcpy(a.Data(), g.data_ptr<float>(), g.numel() * sizeof(float));
  return a;
}

// applyGradients({lr, ..., maxGradNorm, loss?}, grads?: Float32Array) -> {gradNorm, skipped, skipReason, step}:
// the optimizer half of a step (norm, NaN/inf skip, clipping, AdamW, gradients cleared) on the given
// flat gradients (as gradients() lays them out) or on those the last trainStep({update: false}) left.
Napi::Value ModelWrap::ApplyGradients(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "applyGradients expects an options object.");
  auto o = info[0].As<Napi::Object>();
  auto oc = read_optim(env, o);
  const double loss = num_field(env, o, "loss", 0);
  std::vector<float> flat;
  const bool given = info.Length() > 1 && !info[1].IsUndefined();
  if (given) flat = float32s(env, info[1], "grads");
  auto l = lease(env, "applyGradients", true);
  const double value_loss = num_field(env, o, "valueLoss", 0);
  auto opt = optimizer_;
  auto copt = critic_optimizer_;
  auto stats = std::make_shared<slm::TrainStats>();
  return LambdaWorker::Start(
      env, "slm:applyGradients", info.This().As<Napi::Object>(),
      [m, opt, copt, oc, loss, value_loss, flat = std::move(flat), given, stats] {
        if (given) slm::set_flat_gradients(*m, at::from_blob(const_cast<float*>(flat.data()), {static_cast<int64_t>(flat.size())}, at::kFloat));
        stats->loss = loss;
        stats->value_loss = value_loss;
        slm::apply_gradients(*m, *opt, oc, *stats, copt.get());
      },
      [this, stats, opt](Napi::Env e) {
        account(e);
        auto r = Napi::Object::New(e);
        r.Set("gradNorm", stats->grad_norm);
        r.Set("criticGradNorm", stats->critic_grad_norm);
        r.Set("skipped", stats->skipped);
        r.Set("skipReason", stats->skip_reason);
        r.Set("step", static_cast<double>(opt->step));
        return r;
      },
      std::move(l));
}

// A digest of every base weight's bytes (FNV-1a), to prove that training leaves them untouched.
Napi::Value ModelWrap::BaseDigest(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = live(env);
  not_writing(env, "baseDigest");
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : m->named_weights()) {
    (void)name;
    auto c = t.detach().to(at::kCPU).contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    const size_t n = c.numel() * c.element_size();
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, std::min<size_t>(8, n - i));
      h = (h ^ w) * 1099511628211ull;
    }
  }
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return Napi::String::New(env, buf);
}

}  // namespace slm_addon
