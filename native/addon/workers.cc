// Machine measurements as async workers (doctor, benchmarks' rooflines).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "addon/convert.h"
#include "addon/workers.h"
#include "core/measure.h"

namespace slm_addon {

namespace {
class MeasureWorker : public PromiseWorker {
 public:
  MeasureWorker(Napi::Env env, std::string kind, int64_t n, std::string dtype, std::string device, double seconds)
      : PromiseWorker(env, "slm:measure"), kind_(std::move(kind)), n_(n), dtype_(std::move(dtype)), device_(std::move(device)), seconds_(seconds) {}

 protected:
  void Run() override {
    c10::InferenceMode guard;
    value_ = kind_ == "matmul" ? slm::measure_matmul_gflops(n_, dtype_, device_, seconds_) : slm::measure_copy_gbps(n_, device_, seconds_);
  }
  Napi::Value Result(Napi::Env env) override { return Napi::Number::New(env, value_); }

 private:
  std::string kind_;
  int64_t n_;
  std::string dtype_, device_;
  double seconds_, value_ = 0;
};
}  // namespace

// measure({kind: 'matmul'|'copy', n, dtype?, device?, seconds?}) -> Promise<number> (GFLOP/s or GB/s)
Napi::Value Measure(const Napi::CallbackInfo& info) {
  auto env = info.Env();
  if (!info[0].IsObject()) throw_error(env, "ARGUMENT_INVALID", "measure expects {kind, n, dtype?, device?, seconds?}.");
  auto o = info[0].As<Napi::Object>();
  auto kind = str_field(env, o, "kind", "matmul");
  if (kind != "matmul" && kind != "copy") throw_error(env, "ARGUMENT_INVALID", "measure kind must be 'matmul' or 'copy', found '" + kind + "'.");
  auto* w = new MeasureWorker(env, kind, int_field(env, o, "n", kind == "matmul" ? 1024 : (int64_t(256) << 20)), str_field(env, o, "dtype", "float32"),
                              str_field(env, o, "device", "cpu"), num_field(env, o, "seconds", 0.5));
  auto p = w->Promise();
  w->Queue();
  return p;
}

}  // namespace slm_addon
