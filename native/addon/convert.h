// TypedArray <-> std::vector / tensor conversions with argument checks that name what was expected.
#pragma once
#include <napi.h>

#include <string>
#include <vector>

#include "addon/errors.h"

namespace slm_addon {

template <class T, napi_typedarray_type K>
std::vector<T> typed_vector(Napi::Env env, const Napi::Value& v, const char* what) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != K)
    throw_error(env, "ARGUMENT_INVALID",
                std::string("expected ") + what + " as a " +
                    (K == napi_int32_array     ? "Int32Array"
                     : K == napi_float32_array ? "Float32Array"
                                               : "Uint8Array") +
                    ".");
  auto a = v.As<Napi::TypedArrayOf<T>>();
  return std::vector<T>(a.Data(), a.Data() + a.ElementLength());
}

inline std::vector<int32_t> int32s(Napi::Env env, const Napi::Value& v, const char* what) {
  return typed_vector<int32_t, napi_int32_array>(env, v, what);
}
inline std::vector<float> float32s(Napi::Env env, const Napi::Value& v, const char* what) {
  return typed_vector<float, napi_float32_array>(env, v, what);
}

// Splits a flat typed array into per-sequence rows (lengths as for ids); empty when absent.
template <class T, napi_typedarray_type K>
std::vector<std::vector<T>> rows_of(Napi::Env env, const Napi::Object& o, const char* k, const std::vector<int32_t>& lengths,
                                    size_t total) {
  std::vector<std::vector<T>> out;
  auto v = o.Get(k);
  if (v.IsUndefined() || v.IsNull()) return out;
  auto flat = typed_vector<T, K>(env, v, k);
  if (flat.size() != total)
    throw_error(
        env, "ARGUMENT_INVALID",
        std::string(k) + " must have one value per token (" + std::to_string(total) + "), found " + std::to_string(flat.size()) + ".");
  size_t off = 0;
  for (auto n : lengths) {
    out.emplace_back(flat.begin() + off, flat.begin() + off + n);
    off += n;
  }
  return out;
}

inline Napi::Value field(const Napi::Object& o, const char* k) { return o.Get(k); }

inline int64_t int_field(Napi::Env env, const Napi::Object& o, const char* k, int64_t dflt, bool required = false) {
  auto v = o.Get(k);
  if (v.IsUndefined() || v.IsNull()) {
    if (required) throw_error(env, "ARGUMENT_INVALID", std::string("missing required integer '") + k + "'.");
    return dflt;
  }
  if (!v.IsNumber()) throw_error(env, "ARGUMENT_INVALID", std::string("expected a number for '") + k + "'.");
  return v.As<Napi::Number>().Int64Value();
}

inline double num_field(Napi::Env env, const Napi::Object& o, const char* k, double dflt) {
  auto v = o.Get(k);
  if (v.IsUndefined() || v.IsNull()) return dflt;
  if (!v.IsNumber()) throw_error(env, "ARGUMENT_INVALID", std::string("expected a number for '") + k + "'.");
  return v.As<Napi::Number>().DoubleValue();
}

inline std::string str_field(Napi::Env env, const Napi::Object& o, const char* k, const std::string& dflt) {
  auto v = o.Get(k);
  if (v.IsUndefined() || v.IsNull()) return dflt;
  if (!v.IsString()) throw_error(env, "ARGUMENT_INVALID", std::string("expected a string for '") + k + "'.");
  return v.As<Napi::String>().Utf8Value();
}

// A boolean option: its value when it is a boolean, else `dflt`.
inline bool bool_field(const Napi::Object& o, const char* k, bool dflt) {
  auto v = o.Get(k);
  return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : dflt;
}

template <class T>
Napi::TypedArrayOf<T> to_typed(Napi::Env env, const std::vector<T>& v) {
  auto a = Napi::TypedArrayOf<T>::New(env, v.size());
  if (!v.empty()) std::memcpy(a.Data(), v.data(), v.size() * sizeof(T));
  return a;
}

}  // namespace slm_addon
