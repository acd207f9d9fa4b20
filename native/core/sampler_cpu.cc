// The CPU path of `sample` (sampler.h): one fused pass per row instead of a chain of whole-batch
// tensor operations. ATen's version of the same arithmetic — logsumexp, exp, a cumulative sum over
// 151,936 ids, a full sort for top-p — makes a dozen passes over [B, V] temporaries that do not fit
// in cache, mostly on one thread; here each row's logits (600 KB for Qwen3's vocabulary) stay in L2
// while they are read, rows are split between the threads, and top-p sorts only the tokens that can
// be inside the nucleus (a histogram of the log-probabilities finds them) instead of the vocabulary.
//
// Same rules as the tensor path, row by row: log-probs of softmax(logits / T) before top-k/top-p;
// greedy rows take the first index of the maximum; top-k keeps the k best, then top-p (if any) is
// applied to their renormalised probabilities (HF's warpers); top-p keeps the best tokens while the
// mass before them is at most p; the token is the first whose cumulative probability reaches
// u x (the kept mass). Ties between equal logits may be ordered differently than ATen's unstable
// sort does; that changes which of two equally likely tokens a given u picks, never a probability.
#include "core/sampler_cpu.h"

#include "core/cpu_gemm.h"
#include "core/cpu_vec.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace slm {

namespace {

struct RowOut {
  int64_t token = 0;
  float logprob = 0;
};

// Descending by logit, then ascending by id (a strict weak order, so sorting is deterministic).
struct ByLogitDesc {
  const float* s;
  bool operator()(int32_t a, int32_t b) const { return s[a] > s[b] || (s[a] == s[b] && a < b); }
};

// The first index whose cumulative sum of p[0..n) reaches u x their total (clamped to the last), with
// the sum accumulated in double and compared in float, as cumsum + searchsorted do.
int64_t pick_from(const float* p, int64_t n, float u) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += p[i];
  return cpu_row_pick(p, n, u * static_cast<float>(total));
}

struct Scratch {
  std::vector<float> s, p, q, shift;
  std::vector<int32_t> idx;
  std::vector<double> hist, bsum;
};

// Plain sampling's pass over a row, in blocks that stay in L1: each block's maximum, then exp(s - m)
// of the block (kept in p) with m the running maximum, the sum so far rescaled when m grows. The row
// is read from memory once instead of twice (a maximum pass, then an exp pass). Per block: the shift
// its p values are relative to, and their sum.
constexpr int64_t kPlainBlock = 2048;

struct Blocked {
  float m;   // the row's maximum
  double z;  // sum of exp(s - m)
};

Blocked plain_pass(const float* s, int64_t V, Scratch& w) {
  const int64_t nb = (V + kPlainBlock - 1) / kPlainBlock;
  w.p.resize(V);
  w.shift.resize(nb);
  w.bsum.resize(nb);
  float m = -std::numeric_limits<float>::infinity();
  double z = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t b0 = b * kPlainBlock, len = std::min(kPlainBlock, V - b0);
    const float bm = cpu_row_max(s + b0, len);
    if (bm > m) {
      z *= std::exp(static_cast<double>(m) - static_cast<double>(bm));  // m = -inf at first: z stays 0
      m = bm;
    }
    w.shift[b] = m;
    w.bsum[b] = cpu_row_exp(s + b0, len, m, w.p.data() + b0);
    z += w.bsum[b];
  }
  return {m, z};
}

// The first id whose cumulative probability reaches u: the block where the blocks' sums, each scaled to
// the row's maximum, reach u x z, then the id inside it (cpu_row_pick on the block's own p).
int64_t plain_pick(const Scratch& w, int64_t V, Blocked r, float u) {
  const double target = static_cast<double>(u) * r.z;
  double acc = 0;
  const int64_t nb = static_cast<int64_t>(w.bsum.size());
  for (int64_t b = 0; b < nb; ++b) {
    const double f = std::exp(static_cast<double>(w.shift[b]) - static_cast<double>(r.m));
    const double c = w.bsum[b] * f;
    if (c > 0 && acc + c >= target) {
      const int64_t b0 = b * kPlainBlock;
      return b0 + cpu_row_pick(w.p.data() + b0, std::min(kPlainBlock, V - b0), static_cast<float>((target - acc) / f));
    }
    acc += c;
  }
  return V - 1;
}

RowOut sample_row(const float* x, int64_t V, float t, bool greedy, int64_t top_k, float top_p, float u, int64_t top_n, int32_t* top_ids,
                  float* top_lps, Scratch& w) {
  const float* s = x;
  if (t != 1.f) {
    w.s.resize(V);
    for (int64_t i = 0; i < V; ++i) w.s[i] = x[i] / t;
    s = w.s.data();
  }
  enum class Rule { Greedy, TopK, TopP, Plain };
  const Rule rule = greedy ? Rule::Greedy : (top_k > 0 && top_k < V) ? Rule::TopK : top_p < 1.f ? Rule::TopP : Rule::Plain;
  Blocked br{};
  if (rule == Rule::Plain) br = plain_pass(s, V, w);  // plain sampling: one blocked pass
  const float m = rule == Rule::Plain ? br.m : cpu_row_max(s, V);
  const double z = rule == Rule::Plain ? br.z : cpu_row_exp(s, V, m, nullptr);
  const float lse = m + static_cast<float>(std::log(z));
  RowOut out;
  if (top_n > 0) {
    const int64_t n = std::min(top_n, V);
    w.idx.resize(V);
    std::iota(w.idx.begin(), w.idx.end(), 0);
    std::partial_sort(w.idx.begin(), w.idx.begin() + n, w.idx.end(), ByLogitDesc{s});
    for (int64_t j = 0; j < n; ++j) top_ids[j] = w.idx[j], top_lps[j] = s[w.idx[j]] - lse;
  }
  if (rule == Rule::Greedy) {
    int64_t arg = 0;
    while (arg < V - 1 && !(s[arg] == m)) ++arg;  // the first index of the maximum
    out.token = arg;
  } else if (rule == Rule::TopK) {
    w.idx.resize(V);
    std::iota(w.idx.begin(), w.idx.end(), 0);
    std::partial_sort(w.idx.begin(), w.idx.begin() + top_k, w.idx.end(), ByLogitDesc{s});
    w.p.resize(top_k);
    float* p = w.p.data();
    for (int64_t j = 0; j < top_k; ++j) p[j] = std::exp(s[w.idx[j]] - lse);
    if (top_p < 1.f) {
      double sum = 0;
      for (int64_t j = 0; j < top_k; ++j) sum += p[j];
      const float fsum = static_cast<float>(sum);
      double cum = 0;
      for (int64_t j = 0; j < top_k; ++j) {
        const float q = p[j] / fsum;
        cum += q;
        p[j] = static_cast<float>(cum) - q > top_p ? 0.f : q;
      }
    }
    out.token = w.idx[pick_from(p, top_k, u)];
  } else if (rule == Rule::TopP) {
    // Only tokens in the histogram bins that hold the first top_p of the mass (plus a margin for
    // rounding) can be in the nucleus; every other token has a smaller logit than all of them.
    constexpr int kBins = 256;
    constexpr float kBinsPerNat = 4.f;
    w.hist.assign(kBins, 0.0);
    w.p.resize(V);
    float* p = w.p.data();
    cpu_row_exp(s, V, lse, p);
    for (int64_t i = 0; i < V; ++i) {
      const float d = (m - s[i]) * kBinsPerNat;
      w.hist[d < kBins - 1 ? static_cast<int>(d) : kBins - 1] += p[i];
    }
    int last_bin = kBins - 1;
    double mass = 0;
    for (int b = 0; b < kBins; ++b) {
      mass += w.hist[b];
      if (mass >= static_cast<double>(top_p) + 1e-3) {
        last_bin = b;
        break;
      }
    }
    w.idx.clear();
    for (int64_t i = 0; i < V; ++i) {
      const float d = (m - s[i]) * kBinsPerNat;
      if ((d < kBins - 1 ? static_cast<int>(d) : kBins - 1) <= last_bin) w.idx.push_back(static_cast<int32_t>(i));
    }
    std::sort(w.idx.begin(), w.idx.end(), ByLogitDesc{s});
    const int64_t n = static_cast<int64_t>(w.idx.size());
    w.q.resize(n);
    float* q = w.q.data();
    double cum = 0;
    int64_t n_kept = n;
    for (int64_t j = 0; j < n; ++j) {
      const float pj = p[w.idx[j]];
      cum += pj;
      if (static_cast<float>(cum) - pj > top_p) {
        n_kept = j;
        break;
      }
      q[j] = pj;
    }
    out.token = w.idx[pick_from(q, n_kept, u)];
  } else {
    // exp(s - lse) would be one more pass over the row: the unnormalised exp(s - shift) of each block,
    // whose sums gave the log-normaliser above, pick the same token (every term and the target scale).
    out.token = plain_pick(w, V, br, u);
  }
  out.logprob = s[out.token] - lse;
  return out;
}

}  // namespace

Sampled sample_cpu(const at::Tensor& logits, const std::vector<float>& temperature, int64_t top_k, const std::vector<float>& top_p,
                   const at::Tensor& u, int64_t top_n) {
  const auto lg = logits.to(at::kFloat).contiguous();
  const int64_t B = lg.size(0), V = lg.size(1);
  const auto uc = u.to(at::kFloat).contiguous();
  auto tokens = at::empty({B}, at::TensorOptions().dtype(at::kLong));
  auto logprobs = at::empty({B}, at::TensorOptions().dtype(at::kFloat));
  const int64_t n_top = top_n > 0 ? std::min(top_n, V) : 0;
  at::Tensor top_ids = n_top ? at::empty({B, n_top}, at::TensorOptions().dtype(at::kInt)) : at::Tensor();
  at::Tensor top_lps = n_top ? at::empty({B, n_top}, at::TensorOptions().dtype(at::kFloat)) : at::Tensor();
  const float* x = lg.data_ptr<float>();
  const float* uu = uc.data_ptr<float>();
  int64_t* tok = tokens.data_ptr<int64_t>();
  float* lp = logprobs.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    thread_local Scratch scratch;
    for (int64_t b = b0; b < b1; ++b) {
      const bool greedy = !(temperature[b] > 0);
      const float t = greedy ? 1.f : temperature[b];
      const float p = top_p.empty() ? 1.f : top_p[top_p.size() == 1 ? 0 : b];
      auto r = sample_row(x + b * V, V, t, greedy, top_k, p, uu[b], n_top, n_top ? top_ids.data_ptr<int32_t>() + b * n_top : nullptr,
                          n_top ? top_lps.data_ptr<float>() + b * n_top : nullptr, scratch);
      tok[b] = r.token;
      lp[b] = r.logprob;
    }
  });
  Sampled out{tokens, logprobs, at::Tensor(), at::Tensor()};
  if (n_top) {
    out.top_ids = top_ids.to(at::kLong);
    out.top_logprobs = top_lps;
  }
  return out;
}

}  // namespace slm
