// NativeOptimizer (optimizer.h): train steps, gradients, applyGradients, the optimizer file. Long
// calls run on worker threads under a writer lease (saving under a reader's).
#include "addon/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/train.h"
#include "core/safetensors.h"

namespace slm_addon {

namespace {

const std::string kCriticPrefix = "critic/";  // the critic optimizer's entries in the optimizer file

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
  o.Set("headChunks", static_cast<double>(s.head_chunks));
  o.Set("skipped", s.skipped);
  o.Set("skipReason", s.skip_reason);
  return o;
}

// A number the caller must pass (no native default: lib/config/schema.ts holds it).
double required_num(Napi::Env env, const Napi::Object& o, const char* k, const char* why) {
  auto v = o.Get(k);
  if (!v.IsNumber())
    throw_error(env, "ARGUMENT_INVALID",
                std::string("trainStep: '") + k + "' is required " + why + ", found " + (v.IsUndefined() ? "nothing" : "a non-number") +
                    "; pass the configured value (lib/config/schema.ts has the defaults).");
  return v.As<Napi::Number>().DoubleValue();
}

// The optimizer file's tensors: the actor's AdamW state, and the separate critic's (when it has
// stepped) under "critic/" names.
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

}  // namespace

Napi::Function OptimizerWrap::Define(Napi::Env env) {
  auto cls = DefineClass(env, kName,
                         {InstanceMethod<&OptimizerWrap::TrainStep>("trainStep"), InstanceMethod<&OptimizerWrap::Gradients>("gradients"),
                          InstanceMethod<&OptimizerWrap::ApplyGradients>("applyGradients"), InstanceMethod<&OptimizerWrap::Save>("save"),
                          InstanceMethod<&OptimizerWrap::Load>("load")});
  data(env)->optimizer_class = Napi::Persistent(cls);
  return cls;
}

// trainStep(batch and loss options, optimizer numbers) -> Promise<stats>: micro-batched forward and
// backward, the loss, clipping and AdamW (update: false leaves the gradients for gradients()).
Napi::Value OptimizerWrap::TrainStep(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "trainStep expects a batch object.");
  auto o = info[0].As<Napi::Object>();
  auto lengths = int32s(env, o.Get("lengths"), "lengths");
  auto ids = int32s(env, o.Get("ids"), "ids");
  size_t total = 0;
  for (auto n : lengths) total += static_cast<size_t>(n);
  if (total != ids.size())
    throw_error(env, "ARGUMENT_INVALID",
                "lengths add up to " + std::to_string(total) + " but " + std::to_string(ids.size()) + " ids were given.");
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
  if (!b.temperature.empty() && b.temperature.size() != b.seqs.size())
    throw_error(env, "ARGUMENT_INVALID", "temperature must have one value per sequence.");
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
    if (lc.kl_estimator != 1 && lc.kl_estimator != 3)
      throw_error(env, "ARGUMENT_INVALID", "klEstimator must be 1 (k1) or 3 (k3), found " + std::to_string(lc.kl_estimator) + ".");
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
  auto l = s_->lease(env, "trainStep", true);
  auto opt = s_->optimizer;
  auto copt = s_->critic_optimizer;
  auto stats = std::make_shared<slm::TrainStats>();
  return LambdaWorker::Start(
      env, "slm:trainStep", info.This().As<Napi::Object>(),
      [m, opt, copt, b, lc, oc, to, stats] { *stats = slm::train_step(*m, *opt, b, lc, oc, to, copt.get()); },
      [s = s_, stats, opt](Napi::Env e) {
        s->account(e);
        auto r = stats_to_js(e, *stats);
        r.Set("step", static_cast<double>(opt->step));
        return r;
      },
      std::move(l));
}

// save(file) / load(file) -> Promise: both optimizers' AdamW state in one safetensors file.
Napi::Value OptimizerWrap::Save(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  s_->live(env);
  auto file = info[0].As<Napi::String>().Utf8Value();
  auto opt = s_->optimizer;
  auto copt = s_->critic_optimizer;
  return LambdaWorker::Start(
      env, "slm:saveOptimizer", info.This().As<Napi::Object>(),
      [opt, copt, file] { slm::write_safetensors(file, optimizer_state(*opt, copt.get())); }, [](Napi::Env e) { return e.Undefined(); },
      s_->lease(env, "saveOptimizer", false));
}

Napi::Value OptimizerWrap::Load(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  auto file = info[0].As<Napi::String>().Utf8Value();
  auto l = s_->lease(env, "loadOptimizer", true);
  auto opt = s_->optimizer;
  auto copt = s_->critic_optimizer;
  return LambdaWorker::Start(
      env, "slm:loadOptimizer", info.This().As<Napi::Object>(),
      [m, opt, copt, file] {
        auto t = slm::read_safetensors_files({file});
        load_optimizer_state(std::move(t.tensors), *opt, *copt, m->device());
      },
      [s = s_](Napi::Env e) {
        s->account(e);
        return e.Undefined();
      },
      std::move(l));
}

// gradients() -> Float32Array: every trainable tensor's gradient flattened in trainable() order (zeros
// where none), e.g. after trainStep({update: false}), for an all-reduce across data-parallel ranks.
Napi::Value OptimizerWrap::Gradients(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  s_->not_writing(env, "gradients");
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
Napi::Value OptimizerWrap::ApplyGradients(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "applyGradients expects an options object.");
  auto o = info[0].As<Napi::Object>();
  auto oc = read_optim(env, o);
  const double loss = num_field(env, o, "loss", 0);
  std::vector<float> flat;
  const bool given = info.Length() > 1 && !info[1].IsUndefined();
  if (given) flat = float32s(env, info[1], "grads");
  auto l = s_->lease(env, "applyGradients", true);
  const double value_loss = num_field(env, o, "valueLoss", 0);
  auto opt = s_->optimizer;
  auto copt = s_->critic_optimizer;
  auto stats = std::make_shared<slm::TrainStats>();
  return LambdaWorker::Start(
      env, "slm:applyGradients", info.This().As<Napi::Object>(),
      [m, opt, copt, oc, loss, value_loss, flat = std::move(flat), given, stats] {
        if (given)
          slm::set_flat_gradients(*m, at::from_blob(const_cast<float*>(flat.data()), {static_cast<int64_t>(flat.size())}, at::kFloat));
        stats->loss = loss;
        stats->value_loss = value_loss;
        slm::apply_gradients(*m, *opt, oc, *stats, copt.get());
      },
      [s = s_, stats, opt](Napi::Env e) {
        s->account(e);
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

}  // namespace slm_addon
