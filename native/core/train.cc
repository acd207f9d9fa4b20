#include "core/train.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "core/critic.h"
#include "core/errors.h"
#include "core/lora.h"

namespace slm {

namespace {

// Packs rows [s0, s1) of per-token data into [b, T-1] target-aligned tensors (index t-1 <-> token t).
at::Tensor pack(const std::vector<std::vector<float>>& src, int64_t s0, int64_t s1, int64_t T, const char* what, size_t expect_rows) {
  auto out = at::zeros({s1 - s0, std::max<int64_t>(T - 1, 1)}, at::kFloat);
  if (src.empty()) return out;
  if (src.size() != expect_rows) fail("ARGUMENT_INVALID", std::string(what) + " must have one row per sequence.");
  auto a = out.accessor<float, 2>();
  for (int64_t i = s0; i < s1; ++i)
    for (size_t t = 1; t < src[i].size(); ++t) a[i - s0][t - 1] = src[i][t];
  return out;
}

// Sums of the loss terms over a step's micro-batches and chunks (each already weighted).
struct Sums {
  double loss = 0, pg = 0, sft = 0, kl = 0, ent = 0, clip = 0, vl = 0, ratio = 0;
  int64_t head_rows = 0, head_chunks = 0;
};

// One micro-batch's tensors on the device: ids, positions, key mask, and the trained positions
// (head: those with a loss weight; a prompt, a tool's output and padding have none, and every loss
// term is a weighted sum, so they add nothing) with their per-token data: w, adv, old_lp, ret,
// old_v [1, n] in head.rows order.
struct MicroBatch {
  HeadRows head;
  int64_t B = 0, T = 0;
  at::Tensor ids, keys, positions, w, adv, old_lp, ret, old_v, ent_w;  // ent_w: the entropy term's weights
};

MicroBatch micro_batch(const TrainBatch& b, int64_t s0, int64_t s1, int64_t T, LossNorm norm, int64_t w_tokens, int64_t w_seqs, bool pg,
                       bool old_lp, bool value, at::Device dev) {
  const int64_t N = static_cast<int64_t>(b.seqs.size()), B = s1 - s0;
  const auto li = at::TensorOptions().dtype(at::kLong);
  auto ids = at::zeros({B, T}, li), keys = at::zeros({B, T}, li);
  auto temp = at::ones({B}, at::kFloat);
  {
    auto ia = ids.accessor<int64_t, 2>();
    auto ka = keys.accessor<int64_t, 2>();
    auto ta = temp.accessor<float, 1>();
    for (int64_t i = s0; i < s1; ++i) {
      for (size_t t = 0; t < b.seqs[i].size(); ++t) {
        ia[i - s0][t] = b.seqs[i][t];
        ka[i - s0][t] = 1;
      }
      if (!b.temperature.empty()) ta[i - s0] = b.temperature[i];
    }
  }
  const auto w = loss_weights(b.mask, s0, s1, T, norm, w_tokens, w_seqs);  // [B, T - 1]
  MicroBatch mb{
      HeadRows(w, ids, temp, dev), B, T, ids.to(dev), keys.to(dev), at::arange(T, li).unsqueeze(0).expand({B, T}).contiguous().to(dev)};
  mb.w = mb.head.select(w);
  if (pg) {
    mb.adv = mb.head.select(pack(b.advantages, s0, s1, T, "advantages", N));
    if (old_lp) mb.old_lp = mb.head.select(pack(b.old_logprobs, s0, s1, T, "old_logprobs", N));
  }
  mb.ent_w = b.entropy_scale.empty() ? mb.w : mb.w * mb.head.select(pack(b.entropy_scale, s0, s1, T, "entropy_scale", N));
  if (value) {
    mb.ret = mb.head.select(pack(b.returns, s0, s1, T, "returns", N));
    mb.old_v = mb.head.select(pack(b.old_values, s0, s1, T, "old_values", N));
  }
  return mb;
}

// Forward, losses and backward of one micro-batch; the vocab projection and the loss run on the
// trained positions alone, in chunks of rows.
void micro_step(Qwen3Model& m, const MicroBatch& mb, const LossConfig& lc, const TrainOptions& to, Sums& s, HeadBuffers& bufs) {
  const bool pg = lc.kind == LossKind::PG, value = lc.vf_coef > 0;
  const auto& hr = mb.head;
  const int64_t n = hr.n;
  if (n == 0) return;  // nothing trained in this micro-batch: no term of the loss depends on it
  const auto dev = m.device();
  const int64_t V = m.config().vocab_size;
  const int64_t chunk = head_chunk_rows(V);
  at::Tensor ref_lp;
  if (pg && lc.kl_coef > 0) {
    at::NoGradGuard ng;  // the reference policy: the frozen reference adapter, else the base weights
    const auto href = hr.hidden(m.hidden(mb.ids, mb.positions, mb.keys, nullptr, ForwardOptions{false, false, false, true}));
    ref_lp = at::zeros({1, n}, at::TensorOptions().dtype(at::kFloat).device(dev));
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t c = std::min(chunk, n - c0);
      ref_lp.narrow(1, c0, c).copy_(
          head_token_stats(href.narrow(1, c0, c), m.head_weight(), hr.temp.narrow(1, c0, c), hr.targets.narrow(1, c0, c), bufs).lp);
    }
  }
  auto h = m.hidden(mb.ids, mb.positions, mb.keys, nullptr, ForwardOptions{true, true, to.checkpoint});
  // Chunked head: the vocab projection and the loss run per chunk of trained rows on a detached copy
  // of their hidden states, each chunk's graph freed after its backward; the summed gradient then
  // flows into the decoder in one backward.
  auto hs = hr.hidden(h.detach()).requires_grad_(true);  // [1, n, H]
  s.head_rows += n;
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    ++s.head_chunks;
    auto wc = mb.w.narrow(1, c0, c);
    const auto stats =
        head_token_stats(hs.narrow(1, c0, c), m.head_weight(), hr.temp.narrow(1, c0, c), hr.targets.narrow(1, c0, c), bufs);  // [1, c] each
    const auto& lp = stats.lp;
    at::Tensor loss;
    s.ent += (stats.ent.detach() * wc).sum().item<double>();
    if (!pg) {
      loss = sft_loss(lp, wc);
      s.sft += loss.item<double>();
    } else {
      auto p = policy_loss(lp, lc.old_from_forward ? lp.detach() : mb.old_lp.narrow(1, c0, c), mb.adv.narrow(1, c0, c), wc, lc.clip_low,
                           lc.clip_high);
      loss = p.loss;
      s.pg += loss.item<double>();
      s.clip += p.clipped.item<double>();
      s.ratio += p.ratio.item<double>();
      if (lc.kl_coef > 0) {
        auto kll = kl_penalty(lp, ref_lp.narrow(1, c0, c), wc, lc.kl_estimator);
        s.kl += kll.item<double>();
        loss = loss + lc.kl_coef * kll;
      }
      if (lc.entropy_coef > 0)
        loss = loss - lc.entropy_coef * (stats.ent * mb.ent_w.narrow(1, c0, c)).sum();  // entropy_bonus: sum(w sum p log p)
    }
    if (value) {
      auto vll =
          value_loss(m.value_head.forward(hs.narrow(1, c0, c)), mb.old_v.narrow(1, c0, c), mb.ret.narrow(1, c0, c), wc, lc.value_clip);
      s.vl += vll.item<double>();
      loss = loss + lc.vf_coef * vll;
    }
    s.loss += loss.item<double>();
    if (loss.requires_grad()) loss.backward();
  }
  if (hs.grad().defined() && h.requires_grad()) h.narrow(1, 0, mb.T - 1).backward(hr.scatter(hs.grad()));
}

// The separate critic's part of a micro-batch: its own forward (the critic adapter on the shared
// base, training mode), the value head on the trained positions, the value loss alone, backward.
void critic_micro_step(Qwen3Model& m, const MicroBatch& mb, const LossConfig& lc, const TrainOptions& to, Sums& s) {
  if (mb.head.n == 0) return;
  ForwardOptions fo{true, true, to.checkpoint};
  fo.critic = true;
  const auto h = mb.head.hidden(m.hidden(mb.ids, mb.positions, mb.keys, nullptr, fo));  // [1, n, H]
  auto vll = value_loss(m.value_head.forward(h), mb.old_v, mb.ret, mb.w, lc.value_clip);
  s.vl += vll.item<double>();
  vll.backward();
}

}  // namespace

TrainStats train_step(Qwen3Model& m, AdamW& opt, const TrainBatch& b, const LossConfig& lc, const OptimConfig& oc, const TrainOptions& to,
                      AdamW* critic_opt) {
  TrainStats st;
  const bool separate = m.has_critic();
  if (separate && !critic_opt) fail("ARGUMENT_INVALID", "the model has a separate critic adapter: the step needs the critic's optimizer.");
  auto params = trainable(m);
  if (params.empty())
    fail("NO_TRAINABLE_PARAMETERS", "nothing to train: attach or load a LoRA adapter (and, for PPO, a value head) first.");
  const int64_t N = static_cast<int64_t>(b.seqs.size());
  if (static_cast<int64_t>(b.mask.size()) != N) fail("ARGUMENT_INVALID", "the batch needs one loss mask per sequence.");
  const bool pg = lc.kind == LossKind::PG;
  if (pg && (b.advantages.size() != b.seqs.size() || (!lc.old_from_forward && b.old_logprobs.size() != b.seqs.size())))
    fail("ARGUMENT_INVALID",
         "the policy-gradient loss needs per-token advantages and old log-probs for every sequence (or oldFromForward).");
  if (!b.entropy_scale.empty() && b.entropy_scale.size() != b.seqs.size())
    fail("ARGUMENT_INVALID", "entropyScale needs one row per sequence, or none.");
  const bool value = lc.vf_coef > 0;
  if (value && (!m.value_head.defined() || b.returns.size() != b.seqs.size() || b.old_values.size() != b.seqs.size()))
    fail("ARGUMENT_INVALID", "the value loss needs a value head and per-token returns and old values for every sequence.");
  // Trained tokens per sequence: the loss weights' denominators.
  int64_t total = 0, seqs_with_tokens = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (b.mask[i].size() != b.seqs[i].size())
      fail("ARGUMENT_INVALID", "sequence " + std::to_string(i) + ": the loss mask must have one entry per token.");
    int64_t n = 0;
    for (size_t t = 1; t < b.mask[i].size(); ++t) n += b.mask[i][t] ? 1 : 0;
    total += n;
    seqs_with_tokens += n > 0;
  }
  st.tokens = total;
  st.sequences = seqs_with_tokens;
  // The loss weights' denominators: this batch's counts, or the global batch's (data-parallel ranks).
  const int64_t w_tokens = to.norm_tokens > 0 ? to.norm_tokens : total;
  const int64_t w_seqs = to.norm_sequences > 0 ? to.norm_sequences : seqs_with_tokens;
  if (to.norm_tokens > 0 && (to.norm_tokens < total || to.norm_sequences < seqs_with_tokens))
    fail("ARGUMENT_INVALID", "normTokens/normSequences (" + std::to_string(to.norm_tokens) + "/" + std::to_string(to.norm_sequences) +
                                 ") are the global batch's counts and cannot be smaller than this batch's (" + std::to_string(total) + "/" +
                                 std::to_string(seqs_with_tokens) + ").");
  if (to.seed) at::manual_seed(*to.seed);
  clear_grads(params);
  if (total == 0) {
    st.skipped = true;
    st.skip_reason = "no trained tokens in the batch (every loss mask is 0)";
    return st;
  }
  const LossNorm norm = lc.token_level || !pg ? LossNorm::Token : LossNorm::Sequence;
  const int64_t mbs = to.micro_batch > 0 ? to.micro_batch : N;
  Sums s;
  HeadBuffers bufs;  // the vocab head's logits, reused by every chunk of every micro-batch
  at::AutoGradMode grad_on(true);
  for (int64_t s0 = 0; s0 < N; s0 += mbs) {
    const int64_t s1 = std::min(N, s0 + mbs);
    int64_t T = 0;
    for (int64_t i = s0; i < s1; ++i) T = std::max<int64_t>(T, static_cast<int64_t>(b.seqs[i].size()));
    if (T < 2) continue;
    const auto mb = micro_batch(b, s0, s1, T, norm, w_tokens, w_seqs, pg, !lc.old_from_forward, value, m.device());
    // A separate critic: the actor's loss without the value term, then the critic's own pass.
    LossConfig actor = lc;
    if (separate) actor.vf_coef = 0;
    micro_step(m, mb, actor, to, s, bufs);
    if (separate && value) critic_micro_step(m, mb, lc, to, s);
  }
  st.loss = s.loss;
  st.sft_loss = s.sft;
  st.pg_loss = s.pg;
  st.kl = s.kl;
  st.value_loss = s.vl;
  // Token-weighted means of the diagnostics (weights sum to 1 over the batch).
  st.entropy = s.ent;
  st.clip_frac = s.clip;
  st.ratio = s.ratio;
  st.head_rows = s.head_rows;
  st.head_chunks = s.head_chunks;
  if (to.update) {
    apply_gradients(m, opt, oc, st, critic_opt);
  } else {
    st.grad_norm = grad_norm(separate ? actor_params(m) : params);
    st.critic_grad_norm = separate ? grad_norm(critic_params(m)) : 0;
  }
  return st;
}

void apply_gradients(Qwen3Model& m, AdamW& opt, const OptimConfig& oc, TrainStats& st, AdamW* critic_opt) {
  if (!m.has_critic()) {
    auto r = apply_update(trainable(m), opt, oc, st.loss);
    st.grad_norm = r.grad_norm;
    st.skipped = r.skipped;
    st.skip_reason = r.skip_reason;
    return;
  }
  if (!critic_opt) fail("ARGUMENT_INVALID", "the model has a separate critic adapter: the update needs the critic's optimizer.");
  auto r = apply_update(actor_params(m), opt, oc, st.loss);
  st.grad_norm = r.grad_norm;
  st.skipped = r.skipped;
  st.skip_reason = r.skipped ? "actor: " + r.skip_reason : "";
  const auto cp = critic_params(m);
  bool any = false;
  for (const auto& [name, p] : cp) any = any || p.grad().defined();
  if (!any) return;  // no value loss in this step: the critic and its optimizer stay as they are
  OptimConfig c = oc;
  c.lr = oc.value_lr >= 0 ? oc.value_lr : oc.lr;
  c.value_lr = -1;
  c.max_grad_norm = oc.critic_max_grad_norm >= 0 ? oc.critic_max_grad_norm : oc.max_grad_norm;
  auto rc = apply_update(cp, *critic_opt, c, st.value_loss);
  st.critic_grad_norm = rc.grad_norm;
  if (rc.skipped) {
    st.skipped = true;
    st.skip_reason += (st.skip_reason.empty() ? "" : "; ") + ("critic: " + rc.skip_reason);
  }
}

at::Tensor flat_gradients(const Qwen3Model& m) {
  std::vector<at::Tensor> parts;
  for (const auto& [name, p] : trainable(m)) {
    (void)name;
    parts.push_back(p.grad().defined() ? p.grad().detach().to(at::kFloat).reshape({-1})
                                       : at::zeros({p.numel()}, p.options().dtype(at::kFloat)));
  }
  if (parts.empty()) fail("NO_TRAINABLE_PARAMETERS", "no trainable tensors: attach or load a LoRA adapter first.");
  return at::cat(parts);
}

void set_flat_gradients(Qwen3Model& m, const at::Tensor& flat) {
  auto params = trainable(m);
  int64_t n = 0;
  for (const auto& [name, p] : params) n += p.numel();
  if (flat.numel() != n)
    fail("ARGUMENT_INVALID", "gradients: expected " + std::to_string(n) + " values (every trainable tensor, flattened in order), found " +
                                 std::to_string(flat.numel()) + ".");
  int64_t off = 0;
  for (const auto& [name, p] : params) {
    (void)name;
    p.mutable_grad() = flat.narrow(0, off, p.numel()).to(p.device(), p.scalar_type()).view(p.sizes()).clone();
    off += p.numel();
  }
}

}  // namespace slm
