// The vector bodies of cpu_norm.cc's kernels, written once against `V` (core/simd.h) and included
// inside each instruction set's target region and namespace. Per element the arithmetic is the scalar
// path's (products, then roundings to the dtype where ATen rounds); only the sum of squares is added
// in another order (W lanes, then across them).

inline V::F ld(const float* p) { return V::load(p); }
inline V::F ld(const c10::BFloat16* p) { return V::load(reinterpret_cast<const uint16_t*>(p)); }
// A float32 value as the dtype holds it: bfloat16 rounds it; float32 keeps it, but as a value of its
// own, so that the compiler does not fuse the product it came from into the next addition (GCC
// contracts a*b + c into one fused multiply-add by default, one rounding fewer than ATen's).
inline V::F as(V::F x, const float*) {
  __asm__("" : "+x"(x));
  return x;
}
inline V::F as(V::F x, const c10::BFloat16*) { return V::round_bf16(x); }
// Stores a value already representable in the dtype.
inline void st(float* p, V::F v) { V::store(p, v); }
inline void st(c10::BFloat16* p, V::F v) { V::store(reinterpret_cast<uint16_t*>(p), v); }

// h = w * T(x * rsqrt(mean(x^2) + eps)) rounded to T, as float32 (norm_row's values); w null: x as is.
template <class T>
void norm_row_vec(const T* x, const T* w, float* h, int64_t H, float eps) {
  int64_t i = 0;
  if (!w) {
    for (; i + V::W <= H; i += V::W) V::store(h + i, ld(x + i));
    for (; i < H; ++i) h[i] = static_cast<float>(x[i]);
    return;
  }
  V::F acc = V::zero();
  for (; i + V::W <= H; i += V::W) {
    const V::F v = ld(x + i);
    acc = V::fmadd(v, v, acc);
  }
  float ss = V::reduce_add(acc);
  for (; i < H; ++i) ss += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  const V::F vi = V::set1(inv);
  i = 0;
  for (; i + V::W <= H; i += V::W) V::store(h + i, as(V::mul(ld(w + i), as(V::mul(ld(x + i), vi), x)), x));
  for (; i < H; ++i) h[i] = rounded<T>(static_cast<float>(w[i]) * rounded<T>(static_cast<float>(x[i]) * inv));
}

// y (T) = the normalised row.
template <class T>
void rms_norm_row(const T* x, const T* w, T* y, int64_t H, float eps, float* h) {
  norm_row_vec(x, w, h, H, eps);
  int64_t i = 0;
  for (; i + V::W <= H; i += V::W) st(y + i, V::load(h + i));  // already the dtype's values
  for (; i < H; ++i) y[i] = static_cast<T>(h[i]);
}

// One head: (optional) norm, then y = T(T(h * cos) + T(rotate_half(h) * sin)).
template <class T>
void norm_rope_row(const T* x, const T* w, const T* c, const T* s, T* y, int64_t D, float eps, float* h) {
  norm_row_vec(x, w, h, D, eps);
  const int64_t half = D / 2;
  int64_t i = 0;
  if (half % V::W == 0) {
    const V::F neg = V::set1(-1.f);  // an exact negation, signed zeros included
    for (; i < D; i += V::W) {
      const V::F rot = i < half ? V::mul(V::load(h + i + half), neg) : V::load(h + i - half);
      st(y + i, as(V::add(as(V::mul(V::load(h + i), ld(c + i)), x), as(V::mul(rot, ld(s + i)), x)), x));
    }
  }
  for (; i < D; ++i) {
    const float rot = i < half ? -h[i + half] : h[i - half];
    y[i] = static_cast<T>(rounded<T>(h[i] * static_cast<float>(c[i])) + rounded<T>(rot * static_cast<float>(s[i])));
  }
}

// W lanes of the MLP's gate: T(T(silu(g)) * u), silu(g) = g / (1 + exp(-g)) in float32 as ATen writes
// it (the exp of core/simd.h, within 2 ulp of expf: a bfloat16 result may differ from ATen's by one
// rounding, rarely; a float32 one by a few units in the last place).
template <class T>
inline V::F silu_mul_lanes(V::F g, V::F u) {
  const V::F s = as(V::div(g, V::add(V::set1(1.f), V::exp(V::mul(g, V::set1(-1.f))))), static_cast<const T*>(nullptr));
  return as(V::mul(s, u), static_cast<const T*>(nullptr));
}

// One row of n: whole vectors, then the tail through the same lanes (zero-padded), so that every
// element gets the same arithmetic wherever it falls (a row's values never depend on the batch).
template <class T>
void silu_mul_row(const T* g, const T* u, T* y, int64_t n) {
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) st(y + i, silu_mul_lanes<T>(ld(g + i), ld(u + i)));
  if (i < n) {
    alignas(64) float gt[V::W] = {}, ut[V::W] = {}, yt[V::W];
    for (int64_t j = i; j < n; ++j) gt[j - i] = static_cast<float>(g[j]), ut[j - i] = static_cast<float>(u[j]);
    V::store(yt, silu_mul_lanes<T>(V::load(gt), V::load(ut)));
    for (int64_t j = i; j < n; ++j) y[j] = static_cast<T>(yt[j - i]);  // already the dtype's values
  }
}
