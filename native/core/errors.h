// Errors of the native core: a stable string code (the same codes as lib/errors.ts) and a message
// that says what was expected and what was found. The addon turns them into JS SlmError objects.
#pragma once
#include <stdexcept>
#include <string>

namespace slm {

struct EngineError : std::runtime_error {
  std::string code;
  EngineError(std::string code_, const std::string& message) : std::runtime_error(message), code(std::move(code_)) {}
};

[[noreturn]] inline void fail(const std::string& code, const std::string& message) { throw EngineError(code, message); }

}  // namespace slm
