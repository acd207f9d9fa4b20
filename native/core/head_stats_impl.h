// The fused vocabulary head's row passes (losses.cc), written once against `V` (core/simd.h) and
// included inside each instruction set's target region and namespace. Per row of V logits (151,936
// float32 for Qwen: 600 KB, in L2 after the max) one pass for the log-sum-exp, the target's log-prob
// and the entropy, and one for the gradient, instead of ATen's ~12 passes over the [B, c, V] block.
// Each lane's arithmetic is the same at every level (the same exp polynomial, fused multiply-adds);
// the sums are taken in another order (W lanes, then across them, per block of 1,024 into a double).

// v with the lanes from n on set to 0.
inline V::F zero_from(V::F v, int n) {
  alignas(64) float b[V::W];
  V::store(b, v);
  for (int i = n; i < V::W; ++i) b[i] = 0.f;
  return V::load(b);
}

// lse = logsumexp(x / T), lp = x[tgt] / T - lse, ent = lse - sum_v p_v x_v / T; it = 1 / T.
inline void row_stats(const float* x, int64_t n, float it, int64_t tgt, float* lse, float* lp, float* ent) {
  const float m = cpu_row_max(x, n);
  const V::F vm = V::set1(m), vit = V::set1(it);
  double s = 0, sx = 0;  // sum of e = exp((x - m) / T), sum of e x
  for (int64_t v = 0; v < n;) {
    const int64_t end = std::min(n, v + 1024);
    V::F a = V::zero(), b = V::zero();
    for (; v + V::W <= end; v += V::W) {
      const V::F xv = V::load(x + v);
      const V::F e = V::exp(V::mul(V::sub(xv, vm), vit));
      a = V::add(a, e);
      b = V::fmadd(e, xv, b);
    }
    if (v < end) {  // the row's last values (n not a multiple of W)
      const int k = static_cast<int>(end - v);
      const V::F xv = V::load_n(x + v, k);
      const V::F e = zero_from(V::exp(V::mul(V::sub(xv, vm), vit)), k);
      a = V::add(a, e);
      b = V::fmadd(e, xv, b);
      v = end;
    }
    s += V::reduce_add(a);
    sx += V::reduce_add(b);
  }
  *lse = static_cast<float>(m * static_cast<double>(it) + std::log(s));
  *lp = x[tgt] * it - *lse;
  *ent = static_cast<float>(*lse - sx / s * it);
}

// x := d (a lp + b ent) / d x = (onehot a - p (a + b (log p + ent))) / T, log p = x / T - lse.
inline void row_grad(float* x, int64_t n, float it, float lse, float ent, float a, float b, int64_t tgt) {
  const V::F vit = V::set1(it), neg_lse = V::set1(-lse), vh = V::set1(ent), va = V::set1(a), vb = V::set1(b);
  const auto grad = [&](V::F xv) {
    const V::F lq = V::fmadd(xv, vit, neg_lse);  // x / T - lse, rounded once
    const V::F w = V::fmadd(vb, V::add(lq, vh), va);
    return V::mul(V::sub(V::zero(), V::mul(V::exp(lq), w)), vit);
  };
  int64_t v = 0;
  for (; v + V::W <= n; v += V::W) V::store(x + v, grad(V::load(x + v)));
  if (v < n) {
    const int k = static_cast<int>(n - v);
    V::store_n(x + v, grad(V::load_n(x + v, k)), k);
  }
  x[tgt] += a * it;
}
