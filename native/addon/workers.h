// Async workers: every long native call runs on a libuv worker thread and resolves a Promise. JS
// arguments are copied into plain structs on the main thread; Execute touches no N-API; the JS
// object whose method started the work is referenced until the worker ends.
#pragma once
#include <napi.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "addon/errors.h"

namespace slm_addon {

// Hands the memory freed by a native call back to the OS (glibc's malloc_trim; a no-op elsewhere).
// Tensors of varying sizes (batches of varying length) otherwise fragment glibc's heap: a tiny
// model's GRPO steps grew to 7-10 GB of resident memory in 30 steps (and a run was OOM-killed on a
// 24 GB machine), against ~0.3 GB live. Forcing large blocks through mmap instead (a fixed
// M_MMAP_THRESHOLD) kept memory down but made each training step 1.8x slower (page faults on every
// allocation), and trimming after every call 1.2x slower (the next call re-faults its working set):
// this trims when resident memory has grown by a slack (min(4 GiB, RAM / 4)) since the last trim, after
// freeing the blocks the CPU tensor cache holds (core/cpu_cache.h).
void release_free_memory();

// glibc's thresholds for the tensors of a forward or a training step (1-30 MB each at a few hundred
// tokens): large blocks below 32 MiB (glibc's maximum) come from malloc's heap instead of fresh
// mmaps, and up to 256 MiB of freed heap stays mapped, so the next layer, call or step reuses pages
// instead of faulting in new zeroed ones. With glibc's defaults (a dynamic mmap threshold, a trim
// threshold of twice it) a 512-token forward of the `small` preset faulted ~84,000 pages (330 MB)
// per call and took 350 ms; with these ~14,000 while the pool threads' heaps warm up, then few, and
// 250 ms (2-core EPYC, 2026-11-24). Blocks over 32 MiB are still mmapped, and a thread's heap beyond
// 64 MiB is still unmapped when freed (glibc's per-thread arenas). Growth through fragmentation stays
// bounded by release_free_memory. Called once when the addon loads; the user's own
// MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or glibc.malloc tunables win. Returns what it did,
// for version().malloc.
std::string tune_malloc();

// Which async calls are using a model right now: readers (generate, forward passes, saves) share it;
// a writer (train step, adapter or optimizer load, applyGradients) has it alone. Counted on the main
// thread when a call starts (ModelState::lease, addon/model_state.h; one Usage for all four handles
// of a model) and released when its worker is destroyed (main thread, after the promise settles), so
// a JS caller that awaited a call never sees it as running.
struct Usage {
  std::atomic<int> readers{0}, writers{0};
};

class Lease {
 public:
  Lease() = default;
  Lease(std::shared_ptr<Usage> u, bool writer) : u_(std::move(u)), writer_(writer) { (writer_ ? u_->writers : u_->readers)++; }
  Lease(Lease&& o) noexcept : u_(std::move(o.u_)), writer_(o.writer_) {}
  Lease& operator=(Lease&& o) noexcept {
    release();
    u_ = std::move(o.u_);
    writer_ = o.writer_;
    return *this;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { release(); }

 private:
  void release() {
    if (u_) (writer_ ? u_->writers : u_->readers)--;
    u_.reset();
  }
  std::shared_ptr<Usage> u_;
  bool writer_ = false;
};

class PromiseWorker : public Napi::AsyncWorker {
 public:
  PromiseWorker(Napi::Env env, const char* name, Napi::Object owner = Napi::Object())
      : Napi::AsyncWorker(env, name), deferred_(Napi::Promise::Deferred::New(env)) {
    if (!owner.IsEmpty()) owner_ = Napi::Persistent(owner);
  }
  Napi::Promise Promise() { return deferred_.Promise(); }
  // Keeps the model marked as in use until this worker is destroyed.
  void Hold(Lease lease) { lease_ = std::move(lease); }
  // Runs on the main thread when the call has ended, succeeded or failed, before its promise settles.
  void Finally(std::function<void(Napi::Env)> f) { finally_ = std::move(f); }

 protected:
  virtual void Run() = 0;                         // worker thread: no N-API here
  virtual Napi::Value Result(Napi::Env env) = 0;  // main thread
  void Execute() override {
    if (!capture([this] { Run(); }, err_)) SetError(err_.message);
    release_free_memory();
  }
  void OnOK() override {
    if (finally_) finally_(Env());
    Napi::Value v;
    try {
      v = Result(Env());
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
      return;
    }
    deferred_.Resolve(v);
  }
  void OnError(const Napi::Error&) override {
    if (finally_) finally_(Env());
    deferred_.Reject(make_error(Env(), err_.code, err_.message));
  }

 private:
  Napi::Promise::Deferred deferred_;
  Napi::ObjectReference owner_;
  ErrorInfo err_;
  Lease lease_;
  std::function<void(Napi::Env)> finally_;
};

// The worker idiom of the addon: two lambdas, `run` on the worker thread (no N-API), `result` on the
// main thread, and the Lease that marks the model in use. (Only generation subclasses PromiseWorker
// itself, for its streaming thread-safe function.)
class LambdaWorker : public PromiseWorker {
 public:
  LambdaWorker(Napi::Env env, const char* name, Napi::Object owner, std::function<void()> run, std::function<Napi::Value(Napi::Env)> result)
      : PromiseWorker(env, name, owner), run_(std::move(run)), result_(std::move(result)) {}
  static Napi::Promise Start(Napi::Env env, const char* name, Napi::Object owner, std::function<void()> run,
                             std::function<Napi::Value(Napi::Env)> result, Lease lease = Lease()) {
    auto* w = new LambdaWorker(env, name, owner, std::move(run), std::move(result));
    w->Hold(std::move(lease));
    auto p = w->Promise();
    w->Queue();
    return p;
  }

 protected:
  void Run() override { run_(); }
  Napi::Value Result(Napi::Env env) override { return result_(env); }

 private:
  std::function<void()> run_;
  std::function<Napi::Value(Napi::Env)> result_;
};

}  // namespace slm_addon
