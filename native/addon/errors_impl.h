#pragma once
#include <c10/util/Exception.h>

#include "core/errors.h"

namespace slm_addon {

template <class F>
bool capture(F&& fn, ErrorInfo& err) {
  try {
    fn();
    return true;
  } catch (const slm::EngineError& e) {
    err = {e.code, e.what()};
  } catch (const c10::Error& e) {
    err = {"NATIVE_ERROR", std::string("libtorch: ") + e.what_without_backtrace()};
  } catch (const std::bad_alloc&) {
    err = {"OUT_OF_MEMORY", "the native engine could not allocate memory: use a smaller batch, shorter sequences or a smaller model."};
  } catch (const std::exception& e) {
    err = {"NATIVE_ERROR", e.what()};
  }
  return false;
}

}  // namespace slm_addon
