// decodeSession(opts, onStep, firstRows) -> {done: Promise<stats>, submit(rows): ids, cancel(id)}:
// continuous batching (core/continuous.h) on a worker thread, started with its first rows (ids 0,
// 1, ...) in its inbox (a loop started empty could end before the next rows are submitted). submit()
// and cancel() are called on the main thread while the loop runs; submit takes a request's rows all
// or none (an empty array: the loop has ended, start another); every iteration's tokens go to onStep
// as they are sampled; done resolves with the session's counters when no row is left.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <memory>

#include "addon/convert.h"
#include "addon/model.h"
#include "addon/workers.h"
#include "core/continuous.h"

namespace slm_addon {

namespace {

class SessionWorker : public PromiseWorker {
 public:
  SessionWorker(Napi::Env env, Napi::Object owner, std::shared_ptr<slm::Qwen3Model> m, std::shared_ptr<slm::Vocab> vocab,
                std::shared_ptr<slm::ContinuousBatch> batch, Napi::Function on_step)
      : PromiseWorker(env, "slm:decodeSession", owner), m_(std::move(m)), vocab_(std::move(vocab)), batch_(std::move(batch)) {
    tsfn_ = Napi::ThreadSafeFunction::New(env, on_step, "slm:session-step", 0, 1);
  }

 protected:
  void Run() override {
    c10::InferenceMode guard;
    struct Release {  // the step function is released however the loop ends
      Napi::ThreadSafeFunction& f;
      ~Release() { f.Release(); }
    } release{tsfn_};
    stats_ = batch_->run();
  }
  Napi::Value Result(Napi::Env env) override {
    auto o = Napi::Object::New(env);
    const auto num = [&](const char* k, double v) { o.Set(k, Napi::Number::New(env, v)); };
    num("steps", static_cast<double>(stats_.steps));
    num("rows", static_cast<double>(stats_.rows));
    num("joined", static_cast<double>(stats_.joined));
    num("maxBatch", static_cast<double>(stats_.max_batch));
    num("prefillTokens", static_cast<double>(stats_.prefill_tokens));
    num("rebuilds", static_cast<double>(stats_.rebuilds));
    num("prefillSeconds", stats_.prefill_seconds);
    num("decodeSeconds", stats_.decode_seconds);
    return o;
  }

 public:
  // Loop thread: hands one iteration's event to the JS function (main thread, in order).
  void Deliver(slm::StepEvent&& e) {
    auto* d = new slm::StepEvent(std::move(e));
    if (tsfn_.NonBlockingCall(d, DeliverStep) != napi_ok) delete d;
  }

 private:
  static void DeliverStep(Napi::Env env, Napi::Function fn, slm::StepEvent* d) {
    std::unique_ptr<slm::StepEvent> e(d);
    if (!env || !fn) return;
    try {
      fn.Call({step_event_object(env, *e)});
    } catch (const Napi::Error&) {
      // The JS side (lib/engine/session.ts) catches its own errors.
    }
  }

  std::shared_ptr<slm::Qwen3Model> m_;
  std::shared_ptr<slm::Vocab> vocab_;
  std::shared_ptr<slm::ContinuousBatch> batch_;
  Napi::ThreadSafeFunction tsfn_;
  slm::SessionStats stats_;
};

slm::SessionParams session_params(Napi::Env env, const Napi::Object& o) {
  slm::SessionParams p;
  p.top_k = int_field(env, o, "topK", 0);
  p.top_n = int_field(env, o, "topN", 0);
  if (p.top_n < 0) throw_error(env, "ARGUMENT_INVALID", "decodeSession: topN must be a non-negative integer.");
  p.prefill_chunk = int_field(env, o, "prefillChunk", 256);
  p.max_rows = int_field(env, o, "maxRows", 32);
  p.pad_id = static_cast<int32_t>(int_field(env, o, "padId", 0));
  if (!o.Get("stopTokenIds").IsUndefined()) p.stop_token_ids = int32s(env, o.Get("stopTokenIds"), "stopTokenIds");
  auto ss = o.Get("stopStrings");
  if (ss.IsArray()) {
    auto a = ss.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) {
      if (!a.Get(i).IsString()) throw_error(env, "ARGUMENT_INVALID", "decodeSession: stopStrings must be strings.");
      p.stop_strings.push_back(a.Get(i).As<Napi::String>().Utf8Value());
    }
  }
  return p;
}

// One row of submit(): {ids: Int32Array, maxNewTokens, temperature, topP, seed}, checked here so a
// bad row is refused at once instead of failing the whole loop.
slm::RowRequest row_request(Napi::Env env, const Napi::Object& o, int64_t vocab) {
  slm::RowRequest r;
  r.prompt = int32s(env, o.Get("ids"), "ids");
  if (r.prompt.empty()) throw_error(env, "ARGUMENT_INVALID", "submit: the prompt needs at least one token; found none.");
  for (auto t : r.prompt)
    if (t < 0 || t >= vocab)
      throw_error(env, "TOKEN_OUT_OF_RANGE",
                  "submit: token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ").");
  r.max_new_tokens = int_field(env, o, "maxNewTokens", 16);
  if (r.max_new_tokens < 1)
    throw_error(env, "ARGUMENT_INVALID", "submit: maxNewTokens must be at least 1, found " + std::to_string(r.max_new_tokens) + ".");
  r.temperature = static_cast<float>(num_field(env, o, "temperature", 1.0));
  r.top_p = static_cast<float>(num_field(env, o, "topP", 1.0));
  if (!std::isfinite(r.temperature) || !(r.top_p > 0.f && r.top_p <= 1.f))
    throw_error(env, "ARGUMENT_INVALID", "submit: temperature must be a finite number and topP in (0, 1].");
  const double seed = num_field(env, o, "seed", 0);
  if (!(seed >= 0) || seed > 9007199254740991.0 || seed != std::floor(seed))
    throw_error(env, "ARGUMENT_INVALID", "submit: seed must be a non-negative integer below 2^53.");
  r.seed = static_cast<uint64_t>(seed);
  return r;
}

// A non-empty array of rows, each checked (row_request).
std::vector<slm::RowRequest> row_requests(Napi::Env env, const Napi::Value& v, int64_t vocab) {
  if (!v.IsArray() || v.As<Napi::Array>().Length() == 0)
    throw_error(env, "ARGUMENT_INVALID", "submit expects a non-empty array of row objects.");
  auto a = v.As<Napi::Array>();
  std::vector<slm::RowRequest> rows;
  for (uint32_t i = 0; i < a.Length(); ++i) {
    if (!a.Get(i).IsObject()) throw_error(env, "ARGUMENT_INVALID", "submit expects a non-empty array of row objects.");
    rows.push_back(row_request(env, a.Get(i).As<Napi::Object>(), vocab));
  }
  return rows;
}

}  // namespace

Napi::Value ModelWrap::DecodeSession(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  if (!info[0].IsObject() || !info[1].IsFunction() || !info[2].IsArray())
    throw_error(env, "ARGUMENT_INVALID", "decodeSession expects an options object, a step function and the first rows.");
  auto p = session_params(env, info[0].As<Napi::Object>());
  const int64_t vocab = m->config().vocab_size;
  auto first = row_requests(env, info[2], vocab);
  std::shared_ptr<slm::ContinuousBatch> batch;
  ErrorInfo err;
  if (!capture([&] { batch = std::make_shared<slm::ContinuousBatch>(*m, std::move(p), s_->vocab.get()); }, err))
    throw_error(env, err.code, err.message);
  batch->submit(std::move(first));  // ids 0, 1, ..., before the loop can start
  auto l = s_->lease(env, "decodeSession", false);
  auto* w = new SessionWorker(env, info.This().As<Napi::Object>(), m, s_->vocab, batch, info[1].As<Napi::Function>());
  batch->set_on_step([w](slm::StepEvent&& e) { w->Deliver(std::move(e)); });
  w->Hold(std::move(l));
  auto o = Napi::Object::New(env);
  o.Set("done", w->Promise());
  o.Set("submit", Napi::Function::New(
                      env,
                      [batch, vocab](const Napi::CallbackInfo& ci) -> Napi::Value {
                        auto e = ci.Env();
                        const auto ids = batch->submit(row_requests(e, ci[0], vocab));
                        auto a = Napi::Array::New(e, ids.size());
                        for (size_t i = 0; i < ids.size(); ++i)
                          a.Set(static_cast<uint32_t>(i), Napi::Number::New(e, static_cast<double>(ids[i])));
                        return a;
                      },
                      "submit"));
  o.Set("cancel", Napi::Function::New(
                      env,
                      [batch](const Napi::CallbackInfo& ci) -> Napi::Value {
                        auto e = ci.Env();
                        if (!ci[0].IsNumber()) throw_error(e, "ARGUMENT_INVALID", "cancel expects a row id.");
                        batch->cancel(ci[0].As<Napi::Number>().Int64Value());
                        return e.Undefined();
                      },
                      "cancel"));
  w->Queue();
  return o;
}

}  // namespace slm_addon
