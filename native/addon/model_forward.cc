// Forward passes and generation on NativeModel: logits, generate (batched, or streamed step by step
// with rows that can be cancelled), teacher-forced log-probs and last hidden states. Each is one
// native call per batch, run on a worker thread under a reader lease.
#include "addon/model.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/forward.h"

namespace slm_addon {

namespace {

// Cancel flags of a streamed generate call: one per row, set by the JS `cancel(row)` function on the
// main thread and read by the generating thread.
struct CancelFlags {
  explicit CancelFlags(size_t n) : n(n), v(new std::atomic<uint8_t>[n]) {
    for (size_t i = 0; i < n; ++i) v[i].store(0);
  }
  size_t n;
  std::unique_ptr<std::atomic<uint8_t>[]> v;
};

}  // namespace

Napi::Object step_event_object(Napi::Env env, const slm::StepEvent& e) {
  auto o = Napi::Object::New(env);
  o.Set("rows", to_typed(env, e.rows));
  o.Set("tokens", to_typed(env, e.tokens));
  o.Set("logprobs", to_typed(env, e.logprobs));
  o.Set("topIds", to_typed(env, e.top_ids));
  o.Set("topLogprobs", to_typed(env, e.top_logprobs));
  o.Set("finish", to_typed(env, e.finish));
  return o;
}

namespace {

class GenerateWorker : public PromiseWorker {
 public:
  GenerateWorker(Napi::Env env, Napi::Object owner, std::shared_ptr<slm::Qwen3Model> m, std::shared_ptr<slm::Vocab> vocab,
                 slm::GenerateParams p, std::shared_ptr<slm::EpisodeCacheStore> caches)
      : PromiseWorker(env, "slm:generate", owner),
        m_(std::move(m)),
        vocab_(std::move(vocab)),
        p_(std::move(p)),
        caches_(std::move(caches)) {
    if (!p_.cache_keys.empty()) p_.episode_cache = caches_.get();
  }
  // Streaming: every decode step's tokens go to `on_step` (a JS function, called on the main thread
  // in order, without blocking generation); `cancel` stops rows.
  void Stream(Napi::Env env, Napi::Function on_step, std::shared_ptr<CancelFlags> cancel) {
    tsfn_ = Napi::ThreadSafeFunction::New(env, on_step, "slm:generate-step", 0, 1);
    streaming_ = true;
    cancel_ = std::move(cancel);
  }

 protected:
  void Run() override {
    c10::InferenceMode guard;
    if (cancel_) p_.cancel = cancel_->v.get();
    if (streaming_) {
      p_.on_step = [this](slm::StepEvent&& e) {
        auto* d = new slm::StepEvent(std::move(e));
        if (tsfn_.NonBlockingCall(d, DeliverStep) != napi_ok) delete d;
      };
    }
    struct Release {  // the step function is released however generate ends
      GenerateWorker* w;
      ~Release() {
        if (w->streaming_) w->tsfn_.Release();
      }
    } release{this};
    out_ = slm::generate(*m_, p_, vocab_.get());
  }
  Napi::Value Result(Napi::Env env) override {
    std::vector<int32_t> tokens, lengths, top_ids;
    std::vector<float> lps, top_lps;
    std::vector<uint8_t> finish;
    for (size_t r = 0; r < out_.tokens.size(); ++r) {
      tokens.insert(tokens.end(), out_.tokens[r].begin(), out_.tokens[r].end());
      lps.insert(lps.end(), out_.logprobs[r].begin(), out_.logprobs[r].end());
      lengths.push_back(static_cast<int32_t>(out_.tokens[r].size()));
      finish.push_back(static_cast<uint8_t>(out_.finish[r]));
      if (r < out_.top_ids.size()) {
        top_ids.insert(top_ids.end(), out_.top_ids[r].begin(), out_.top_ids[r].end());
        top_lps.insert(top_lps.end(), out_.top_logprobs[r].begin(), out_.top_logprobs[r].end());
      }
    }
    auto o = Napi::Object::New(env);
    o.Set("tokens", to_typed(env, tokens));
    o.Set("lengths", to_typed(env, lengths));
    o.Set("logprobs", to_typed(env, lps));
    o.Set("finish", to_typed(env, finish));
    if (p_.top_n > 0) {
      o.Set("topIds", to_typed(env, top_ids));
      o.Set("topLogprobs", to_typed(env, top_lps));
    }
    o.Set("steps", Napi::Number::New(env, static_cast<double>(out_.steps)));
    o.Set("prefillSeconds", Napi::Number::New(env, out_.prefill_seconds));
    o.Set("decodeSeconds", Napi::Number::New(env, out_.decode_seconds));
    o.Set("prefillTokens", Napi::Number::New(env, static_cast<double>(out_.prefill_tokens)));
    o.Set("prefillTokensRequested", Napi::Number::New(env, static_cast<double>(out_.prefill_tokens_requested)));
    o.Set("cacheReusedTokens", Napi::Number::New(env, static_cast<double>(out_.cache_reused_tokens)));
    o.Set("cacheHits", Napi::Number::New(env, static_cast<double>(out_.cache_hits)));
    o.Set("cacheEvicted", Napi::Number::New(env, static_cast<double>(out_.cache_evicted)));
    o.Set("cacheStale", Napi::Number::New(env, static_cast<double>(out_.cache_stale)));
    return o;
  }

 private:
  // Main thread: one step's event as {rows, tokens, logprobs, topIds, topLogprobs, finish} to the JS function.
  static void DeliverStep(Napi::Env env, Napi::Function fn, slm::StepEvent* d) {
    std::unique_ptr<slm::StepEvent> e(d);
    if (!env || !fn) return;
    try {
      fn.Call({step_event_object(env, *e)});
    } catch (const Napi::Error&) {
      // The JS side (lib/engine/model.ts) catches its own errors; nothing to do with one here.
    }
  }

  std::shared_ptr<slm::Qwen3Model> m_;
  std::shared_ptr<slm::Vocab> vocab_;
  slm::GenerateParams p_;
  slm::GenerateOutput out_;
  std::shared_ptr<slm::EpisodeCacheStore> caches_;  // kept alive while the call may use it
  Napi::ThreadSafeFunction tsfn_;
  bool streaming_ = false;
  std::shared_ptr<CancelFlags> cancel_;
};

// Splits a flat Int32Array into rows by lengths (checking that they add up).
std::vector<std::vector<int32_t>> split_rows(Napi::Env env, const std::vector<int32_t>& flat, const std::vector<int32_t>& lengths) {
  std::vector<std::vector<int32_t>> rows;
  size_t off = 0;
  for (auto n : lengths) {
    if (n < 0 || off + n > flat.size()) throw_error(env, "ARGUMENT_INVALID", "lengths do not add up to the number of ids.");
    rows.emplace_back(flat.begin() + off, flat.begin() + off + n);
    off += n;
  }
  if (off != flat.size())
    throw_error(env, "ARGUMENT_INVALID",
                "lengths add up to " + std::to_string(off) + " but " + std::to_string(flat.size()) + " ids were given.");
  return rows;
}

}  // namespace

Napi::Value queue_rows(const Napi::CallbackInfo& info, std::shared_ptr<slm::Qwen3Model> m, Lease lease, const char* name, Rows mode) {
  auto env = info.Env();
  const bool lp = mode == Rows::Logprobs;
  if (!info[0].IsObject())
    throw_error(env, "ARGUMENT_INVALID", std::string(name) + (lp ? " expects {ids, lengths, temperature}." : " expects {ids, lengths}."));
  auto o = info[0].As<Napi::Object>();
  const auto lengths = int32s(env, o.Get("lengths"), "lengths");
  auto rows = split_rows(env, int32s(env, o.Get("ids"), "ids"), lengths);
  size_t total = 0;
  for (const auto& r : rows) total += r.size();
  // mask: which positions to score (the others are 0 and skip the vocabulary head).
  auto masks = lp ? rows_of<uint8_t, napi_uint8_array>(env, o, "mask", lengths, total) : std::vector<std::vector<uint8_t>>();
  auto ref = o.Get("reference");
  const bool reference = lp && ref.IsBoolean() && ref.As<Napi::Boolean>().Value();
  // temperature: a number for every row or a Float32Array with one per row (checked by the core).
  std::vector<float> temp{1.f};
  if (lp) {
    auto tv = o.Get("temperature");
    if (tv.IsTypedArray())
      temp = float32s(env, tv, "temperature");
    else
      temp = {static_cast<float>(num_field(env, o, "temperature", 1.0))};
  }
  auto out = std::make_shared<std::vector<std::vector<float>>>();
  return LambdaWorker::Start(
      env,
      mode == Rows::Values       ? "slm:values"
      : mode == Rows::LastHidden ? "slm:hidden"
                                 : "slm:logprobs",
      info.This().As<Napi::Object>(),
      [m, rows = std::move(rows), masks = std::move(masks), temp, mode, reference, out] {
        c10::InferenceMode guard;
        *out = mode == Rows::Values       ? slm::sequence_values(*m, rows)
               : mode == Rows::LastHidden ? slm::last_hidden(*m, rows)
                                          : slm::sequence_logprobs(*m, rows, temp, reference, masks);
      },
      [out](Napi::Env e) {
        std::vector<float> flat;
        for (const auto& r : *out) flat.insert(flat.end(), r.begin(), r.end());
        return to_typed(e, flat);
      },
      std::move(lease));
}

Napi::Value ModelWrap::Logits(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "logits expects {ids, batch, seqLen, attentionMask?, positionIds?}.");
  auto o = info[0].As<Napi::Object>();
  auto ids = int32s(env, o.Get("ids"), "ids");
  const int64_t B = int_field(env, o, "batch", 1), T = int_field(env, o, "seqLen", static_cast<int64_t>(ids.size()));
  if (B <= 0 || T <= 0 || B * T != static_cast<int64_t>(ids.size()))
    throw_error(env, "ARGUMENT_INVALID",
                "ids hold " + std::to_string(ids.size()) + " values but batch x seqLen = " + std::to_string(B * T) + ".");
  const auto li = at::TensorOptions().dtype(at::kLong);
  auto idt = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), li).view({B, T});
  at::Tensor mask = at::ones({B, T}, li), pos;
  if (!o.Get("attentionMask").IsUndefined()) {
    auto mv = int32s(env, o.Get("attentionMask"), "attentionMask");
    if (static_cast<int64_t>(mv.size()) != B * T) throw_error(env, "ARGUMENT_INVALID", "attentionMask must have batch x seqLen values.");
    mask = at::tensor(std::vector<int64_t>(mv.begin(), mv.end()), li).view({B, T});
  }
  if (!o.Get("positionIds").IsUndefined()) {
    auto pv = int32s(env, o.Get("positionIds"), "positionIds");
    if (static_cast<int64_t>(pv.size()) != B * T) throw_error(env, "ARGUMENT_INVALID", "positionIds must have batch x seqLen values.");
    pos = at::tensor(std::vector<int64_t>(pv.begin(), pv.end()), li).view({B, T});
  } else {
    pos = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1);
  }
  auto out = std::make_shared<at::Tensor>();
  return LambdaWorker::Start(
      env, "slm:logits", info.This().As<Napi::Object>(),
      [m, idt, mask, pos, out] {
        c10::InferenceMode guard;
        *out = slm::full_logits(*m, idt, mask, pos);
      },
      [out](Napi::Env e) {
        auto a = Napi::Float32Array::New(e, out->numel());
        std::memcpy(a.Data(), out->data_ptr<float>(), out->numel() * sizeof(float));
        return a;
      },
      s_->lease(env, "logits", false));
}

namespace {
slm::GenerateParams generate_params(Napi::Env env, const Napi::Object& o) {
  slm::GenerateParams p;
  p.prompts = split_rows(env, int32s(env, o.Get("ids"), "ids"), int32s(env, o.Get("lengths"), "lengths"));
  p.max_new_tokens = int_field(env, o, "maxNewTokens", 64);
  p.temperature = float32s(env, o.Get("temperature"), "temperature");
  p.top_k = int_field(env, o, "topK", 0);
  p.top_p = num_field(env, o, "topP", 1.0);
  auto rtp = o.Get("rowTopP");
  if (!rtp.IsUndefined() && !rtp.IsNull()) {
    p.row_top_p = float32s(env, rtp, "rowTopP");
    for (auto q : p.row_top_p)
      if (!(q > 0.f && q <= 1.f)) throw_error(env, "ARGUMENT_INVALID", "generate: every rowTopP value must be in (0, 1].");
  }
  p.seed = static_cast<uint64_t>(num_field(env, o, "seed", 0));
  p.top_n = int_field(env, o, "topN", 0);
  if (p.top_n < 0) throw_error(env, "ARGUMENT_INVALID", "generate: topN must be a non-negative integer.");
  auto rs = o.Get("rowSeeds");
  if (!rs.IsUndefined() && !rs.IsNull()) {
    if (!rs.IsArray()) throw_error(env, "ARGUMENT_INVALID", "generate: rowSeeds must be an array of non-negative integers, one per row.");
    auto a = rs.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) {
      auto v = a.Get(i);
      const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
      if (!(d >= 0) || d > 9007199254740991.0 || d != static_cast<double>(static_cast<uint64_t>(d)))
        throw_error(env, "ARGUMENT_INVALID", "generate: rowSeeds[" + std::to_string(i) + "] must be a non-negative integer below 2^53.");
      p.row_seeds.push_back(static_cast<uint64_t>(d));
    }
  }
  auto rm = o.Get("rowMaxNewTokens");
  if (!rm.IsUndefined() && !rm.IsNull()) {
    auto v = int32s(env, rm, "rowMaxNewTokens");
    p.row_max_new_tokens.assign(v.begin(), v.end());
  }
  p.pad_id = static_cast<int32_t>(int_field(env, o, "padId", 0));
  auto sp = o.Get("sharePrefix");
  if (!sp.IsUndefined() && !sp.IsNull()) {
    if (!sp.IsBoolean()) throw_error(env, "ARGUMENT_INVALID", "generate: sharePrefix must be a boolean.");
    p.share_prefix = sp.As<Napi::Boolean>().Value();
  }
  p.prefill_chunk = int_field(env, o, "prefillChunk", 0);
  if (p.prefill_chunk < 0)
    throw_error(
        env, "ARGUMENT_INVALID",
        "generate: prefillChunk must be 0 (one forward) or a positive number of positions, found " + std::to_string(p.prefill_chunk) + ".");
  auto ck = o.Get("cacheKeys");
  if (!ck.IsUndefined() && !ck.IsNull()) {
    if (!ck.IsArray())
      throw_error(env, "ARGUMENT_INVALID", "generate: cacheKeys must be an array with one string (or null: none) per row.");
    auto a = ck.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) {
      auto v = a.Get(i);
      if (v.IsUndefined() || v.IsNull())
        p.cache_keys.emplace_back();
      else if (v.IsString())
        p.cache_keys.push_back(v.As<Napi::String>().Utf8Value());
      else
        throw_error(env, "ARGUMENT_INVALID", "generate: cacheKeys[" + std::to_string(i) + "] must be a string or null.");
    }
    bool any = false;
    for (const auto& k : p.cache_keys) any = any || !k.empty();
    if (!any) p.cache_keys.clear();
  }
  if (!o.Get("stopTokenIds").IsUndefined()) p.stop_token_ids = int32s(env, o.Get("stopTokenIds"), "stopTokenIds");
  auto ss = o.Get("stopStrings");
  if (ss.IsArray()) {
    auto a = ss.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); ++i) p.stop_strings.push_back(a.Get(i).As<Napi::String>().Utf8Value());
  }
  return p;
}
}  // namespace

Napi::Value ModelWrap::Generate(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "generate expects a request object.");
  auto l = s_->lease(env, "generate", false);
  auto* w =
      new GenerateWorker(env, info.This().As<Napi::Object>(), m, s_->vocab, generate_params(env, info[0].As<Napi::Object>()), s_->caches);
  w->Hold(std::move(l));
  w->Finally([s = s_](Napi::Env e) { s->account(e); });  // the episode caches it stored or evicted
  auto pr = w->Promise();
  w->Queue();
  return pr;
}

// generateStream(req, onStep) -> {done: Promise<result>, cancel(row)}: generate, with every decode
// step's tokens handed to onStep as they are sampled, and rows that can be stopped early.
Napi::Value ModelWrap::GenerateStream(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  auto m = s_->live(env);
  if (!info[0].IsObject() || !info[1].IsFunction())
    throw_error(env, "ARGUMENT_INVALID", "generateStream expects a request object and a step function.");
  auto p = generate_params(env, info[0].As<Napi::Object>());
  auto flags = std::make_shared<CancelFlags>(p.prompts.size());
  auto l = s_->lease(env, "generateStream", false);
  auto* w = new GenerateWorker(env, info.This().As<Napi::Object>(), m, s_->vocab, std::move(p), s_->caches);
  w->Hold(std::move(l));
  w->Finally([s = s_](Napi::Env e) { s->account(e); });
  w->Stream(env, info[1].As<Napi::Function>(), flags);
  auto o = Napi::Object::New(env);
  o.Set("done", w->Promise());
  o.Set("cancel", Napi::Function::New(
                      env,
                      [flags](const Napi::CallbackInfo& ci) -> Napi::Value {
                        auto e = ci.Env();
                        if (!ci[0].IsNumber()) throw_error(e, "ARGUMENT_INVALID", "cancel expects a row index.");
                        const int64_t r = ci[0].As<Napi::Number>().Int64Value();
                        if (r < 0 || static_cast<size_t>(r) >= flags->n)
                          throw_error(e, "ARGUMENT_INVALID", "cancel: row " + std::to_string(r) + " is not in this call.");
                        flags->v[r].store(1);
                        return e.Undefined();
                      },
                      "cancel"));
  w->Queue();
  return o;
}

Napi::Value ModelWrap::SequenceLogprobs(const Napi::CallbackInfo& info) {
  return queue_rows(info, s_->live(info.Env()), s_->lease(info.Env(), "sequenceLogprobs", false), "sequenceLogprobs", Rows::Logprobs);
}

Napi::Value ModelWrap::LastHidden(const Napi::CallbackInfo& info) {
  return queue_rows(info, s_->live(info.Env()), s_->lease(info.Env(), "lastHidden", false), "lastHidden", Rows::LastHidden);
}

}  // namespace slm_addon
