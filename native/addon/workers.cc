// The engine thread every async call runs on, memory trimming, and machine measurements as async
// workers (doctor, benchmarks' rooflines).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#endif

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/measure.h"

namespace slm_addon {

#if defined(__GLIBC__)
namespace {
// Resident bytes of this process (/proc/self/statm), or -1.
int64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}
}  // namespace
#endif

namespace {

// One thread and a queue; created on first use and never destroyed (it outlives every call, and a
// static thread would have to be joined at exit).
class EngineThread {
 public:
  EngineThread() : thread_([this] { loop(); }) { thread_.detach(); }
  void run(const std::function<void()>& f) {
    if (on_engine_) {
      f();
      return;
    }
    std::promise<void> done;
    auto fut = done.get_future();
    {
      std::lock_guard<std::mutex> g(m_);
      q_.emplace_back(&f, &done);
    }
    cv_.notify_one();
    fut.wait();
  }

 private:
  void loop() {
    on_engine_ = true;
    for (;;) {
      std::pair<const std::function<void()>*, std::promise<void>*> job;
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [this] { return !q_.empty(); });
        job = q_.front();
        q_.pop_front();
      }
      try {
        (*job.first)();
      } catch (...) {  // callers capture their errors; this only keeps the thread alive
      }
      job.second->set_value();
    }
  }
  static thread_local bool on_engine_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<const std::function<void()>*, std::promise<void>*>> q_;
  std::thread thread_;
};
thread_local bool EngineThread::on_engine_ = false;

}  // namespace

void run_on_engine_thread(const std::function<void()>& f) {
  static EngineThread* engine = new EngineThread();  // intentionally never deleted
  engine->run(f);
}

void release_free_memory() {
#if defined(__GLIBC__)
  // Trim when resident memory has grown by more than `slack` over what it was after the last trim:
  // a call's working set is then reused by the next call (no re-fault) while fragmentation stays
  // bounded. Slack: a quarter of physical memory, at most 4 GiB.
  static std::atomic<int64_t> after_trim{-1};
  static const int64_t slack = std::min<int64_t>(int64_t(4) << 30, static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 4);
  const int64_t rss = resident_bytes();
  const int64_t base = after_trim.load();
  if (rss >= 0 && base >= 0 && rss < base + slack) return;
  malloc_trim(0);
  after_trim.store(resident_bytes());
#endif
}

// measure({kind: 'matmul'|'copy', n, dtype?, device?, seconds?}) -> Promise<number> (GFLOP/s or GB/s)
Napi::Value Measure(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "measure expects {kind, n, dtype?, device?, seconds?}.");
  auto o = info[0].As<Napi::Object>();
  auto kind = str_field(env, o, "kind", "matmul");
  if (kind != "matmul" && kind != "copy") throw_error(env, "ARGUMENT_INVALID", "measure kind must be 'matmul' or 'copy', found '" + kind + "'.");
  const int64_t n = int_field(env, o, "n", kind == "matmul" ? 1024 : (int64_t(256) << 20));
  auto dtype = str_field(env, o, "dtype", "float32"), device = str_field(env, o, "device", "cpu");
  const double seconds = num_field(env, o, "seconds", 0.5);
  auto value = std::make_shared<double>(0);
  return LambdaWorker::Start(
      env, "slm:measure", Napi::Object(),
      [kind, n, dtype, device, seconds, value] {
        c10::InferenceMode guard;
        *value = kind == "matmul" ? slm::measure_matmul_gflops(n, dtype, device, seconds) : slm::measure_copy_gbps(n, device, seconds);
      },
      [value](Napi::Env e) { return Napi::Number::New(e, *value); });
}

}  // namespace slm_addon
