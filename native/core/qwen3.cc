#include "core/qwen3.h"

#include "core/cpu_gemm.h"
#include "core/cpu_norm.h"
#include "core/cpu_weights.h"
#include "core/lora_train.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>
#include <cmath>
#include <set>

#include "core/errors.h"

namespace slm {

const std::vector<std::string> kModelTypes = {"qwen3", "qwen2", "llama"};
const std::vector<std::string> kRopeTypes = {"default", "llama3"};

namespace {
std::string join_names(const std::vector<std::string>& v) {
  std::string r;
  for (const auto& x : v) r += (r.empty() ? "" : ", ") + x;
  return r;
}
bool contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

void check_arch(const ModelArch& arch, const RopeScaling& rope) {
  if (!contains(kModelTypes, arch.model_type))
    fail("MODEL_TYPE_UNSUPPORTED", "model_type '" + arch.model_type + "' is not implemented by the native engine; supported: " +
                                       join_names(kModelTypes) + ". Use a checkpoint of one of these architectures.");
  if (!contains(kRopeTypes, rope.type))
    fail("MODEL_CONFIG_INVALID",
         "rope_scaling type '" + rope.type + "' is not implemented by the native engine; supported: " + join_names(kRopeTypes) + ".");
  if (rope.type == "llama3" && !(rope.factor > 0 && rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor &&
                                 rope.original_max_position_embeddings > 0))
    fail("MODEL_CONFIG_INVALID",
         "llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0; found "
         "factor " +
             std::to_string(rope.factor) + ", low_freq_factor " + std::to_string(rope.low_freq_factor) + ", high_freq_factor " +
             std::to_string(rope.high_freq_factor) + ", original_max_position_embeddings " +
             std::to_string(rope.original_max_position_embeddings) + ".");
}

at::Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& rope, at::Device device) {
  // Default: inv_freq[i] = 1 / theta^(2i / head_dim).
  auto idx = at::arange(0, head_dim, 2, at::TensorOptions().dtype(at::kDouble).device(device));
  auto inv = 1.0 / at::pow(theta, idx / static_cast<double>(head_dim));
  if (rope.type != "llama3") return inv;
  // Llama 3.1 (HF _compute_llama3_parameters): wavelengths longer than original_max_position /
  // low_freq_factor are slowed down by `factor`, shorter than original / high_freq_factor are kept,
  // and the band between is interpolated linearly in original / wavelength.
  const double old_len = rope.original_max_position_embeddings, lo = rope.low_freq_factor, hi = rope.high_freq_factor;
  const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
  auto wavelen = 2.0 * M_PI / inv;
  auto scaled = at::where(wavelen > low_freq_wavelen, inv / rope.factor, inv);
  auto smooth = (old_len / wavelen - lo) / (hi - lo);
  auto smoothed = (1.0 - smooth) * scaled / rope.factor + smooth * scaled;
  auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

at::ScalarType parse_compute_dtype(const std::string& s) {
  if (s == "float32" || s == "f32" || s == "fp32") return at::kFloat;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  if (s == "float16" || s == "f16" || s == "fp16") return at::kHalf;
  fail("ARGUMENT_INVALID", "compute dtype must be float32, bfloat16 or float16, found '" + s + "'.");
}

namespace {
// The small-row CPU kernel for x · wᵀ when it applies, else an undefined tensor. Never in a training
// forward: a checkpointed layer is run twice (without and with autograd) and both runs must compute
// the same values, so training keeps to ATen throughout.
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const ForwardOptions& o) {
  return o.kernels && !o.train ? cpu_small_linear(x, w) : at::Tensor();  // (it checks rows, device, dtype)
}

// The adapter's two small products.
at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& w, const ForwardOptions& o) {
  at::Tensor y = small_linear(x, w, o);
  return y.defined() ? y : at::linear(x, w);
}
}  // namespace

at::Tensor Linear::forward(const at::Tensor& x, const ForwardOptions& o) const {
  // A few rows (decode) on the CPU: a kernel that reads each weight once (core/cpu_gemm.h); else ATen.
  at::Tensor y = small_linear(x, weight, o);
  if (y.defined()) {
    if (bias.defined()) y = y + bias;
  } else if (x.numel() == x.size(-1) && !x.requires_grad() && weight.scalar_type() == at::kFloat) {
    // One row without the kernel: a matrix-vector product streams the weights once; BLAS gemm
    // would first pack the whole weight matrix (measured 2.2x slower for the vocab projection).
    // float32 only: bfloat16 goes to oneDNN through linear, which is faster than its mv.
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    y = at::mv(weight, x.reshape({-1})).view(sizes);
    if (bias.defined()) y = y + bias;
  } else if (!(y = cpu_linear_widened(x, weight, bias)).defined()) {
    y = bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  }
  const LoraWeights* l = o.reference ? reference.get() : !o.adapter ? nullptr : o.critic ? critic.get() : lora.get();
  if (l) {
    auto xl = x.to(at::kFloat);
    if (o.train && !o.reference && l->dropout > 0) xl = at::dropout(xl, l->dropout, /*train=*/true);
    const auto t = o.train ? lora_train_cpu(y, xl, l->A, l->B, l->scale) : at::Tensor();  // (core/lora_train.h)
    if (t.defined()) return t;
    auto d = lora_linear(lora_linear(xl, l->A, o), l->B, o) * l->scale;  // [.., r] -> [.., out]
    y = y + d.to(y.scalar_type());
  }
  return y;
}

std::vector<std::pair<std::string, Linear*>> Qwen3Layer::projections() {
  return {{"q_proj", &q}, {"k_proj", &k}, {"v_proj", &v}, {"o_proj", &o}, {"gate_proj", &gate}, {"up_proj", &up}, {"down_proj", &down}};
}
std::vector<std::pair<std::string, const Linear*>> Qwen3Layer::projections() const {
  return {{"q_proj", &q}, {"k_proj", &k}, {"v_proj", &v}, {"o_proj", &o}, {"gate_proj", &gate}, {"up_proj", &up}, {"down_proj", &down}};
}

namespace {

std::string shape_str(at::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Takes (and removes) a tensor from the checkpoint, checks its shape, and places it on the device in
// the compute dtype: on the CPU in the model's weight arena (core/cpu_weights.h: one mapping, huge
// pages, load order); on another device `to` copies it there. `arena` null: checked and dropped (a
// tied checkpoint's copy of the head), nothing placed.
at::Tensor take(TensorMap& w, const std::string& name, std::vector<int64_t> shape, const LoadOptions& o, at::Device dev,
                at::ScalarType dtype, CpuWeightArena* arena) {
  auto it = w.tensors.find(name);
  if (it == w.tensors.end())
    fail("WEIGHTS_MISSING", "the checkpoint has no tensor '" + name + "' (expected shape " + shape_str(shape) +
                                " from config.json). The weights do not belong to this config, or a shard is missing.");
  at::Tensor t = it->second;
  if (t.sizes() != at::IntArrayRef(shape))
    fail("WEIGHTS_MISMATCH", "tensor '" + name + "' in " + w.source[name] + " has shape " + shape_str(t.sizes()) +
                                 " but config.json implies " + shape_str(shape) + ". Check that config.json belongs to these weights.");
  if (!at::isFloatingType(t.scalar_type()))
    fail("DTYPE_UNSUPPORTED",
         "tensor '" + name + "' has integer dtype " + std::string(c10::toString(t.scalar_type())) + "; expected F32, F16 or BF16.");
  w.tensors.erase(it);
  (void)o;
  if (!arena) return {};
  if (dev.is_cpu()) return arena->place(t, dtype);
  return t.to(dev, dtype);
}

}  // namespace

Qwen3Model::Qwen3Model(const Qwen3Config& cfg, TensorMap&& w, const LoadOptions& opts)
    : cfg_(cfg), device_(opts.device), dtype_(opts.dtype) {
  check_arch(cfg.arch, cfg.rope_scaling);
  const auto& arch = cfg.arch;
  if (device_.is_cuda() && !at::hasCUDA())
    fail("DEVICE_UNAVAILABLE", "device '" + opts.device +
                                   "' was asked for, but this libtorch has no CUDA support (or no GPU is visible). Use device cpu, or "
                                   "build against a CUDA libtorch.");
  if (dtype_ == at::kHalf && !device_.is_cuda())
    fail("ARGUMENT_INVALID", "float16 compute is only supported on CUDA; on CPU use float32 or bfloat16.");
  const int64_t H = cfg.hidden_size, D = cfg.head_dim, V = cfg.vocab_size, I = cfg.intermediate_size;
  const int64_t nq = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  if (nq % nkv != 0)
    fail("MODEL_CONFIG_INVALID",
         "num_attention_heads (" + std::to_string(nq) + ") must be a multiple of num_key_value_heads (" + std::to_string(nkv) + ").");
  if (D % 2 != 0) fail("MODEL_CONFIG_INVALID", "head_dim must be even for rotary embeddings, found " + std::to_string(D) + ".");
  // The CPU's weight arena, sized for every checkpoint tensor that is placed by copying (a tied
  // checkpoint's copy of the head is only checked; a tensor the model does not use fails below).
  size_t arena_bytes = 0;
  if (device_.is_cpu())
    for (const auto& kv : w.tensors)
      if (!(cfg.tie_word_embeddings && kv.first == "lm_head.weight") && at::isFloatingType(kv.second.scalar_type()) &&
          cpu_weight_copied(kv.second, dtype_))
        arena_bytes += CpuWeightArena::slot_bytes(kv.second, dtype_);
  CpuWeightArena arena(arena_bytes);
  auto T = [&](const std::string& n, std::vector<int64_t> s) { return take(w, n, std::move(s), opts, device_, dtype_, &arena); };
  embed_ = T("model.embed_tokens.weight", {V, H});
  norm_ = T("model.norm.weight", {H});
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Qwen3Layer L;
    L.input_norm = T(p + "input_layernorm.weight", {H});
    L.post_norm = T(p + "post_attention_layernorm.weight", {H});
    // A projection [out, in] and, when the architecture has one, its bias [out].
    auto proj = [&](Linear& l, const std::string& name, int64_t out, int64_t in, bool bias) {
      l.weight = T(p + name + ".weight", {out, in});
      if (bias) l.bias = T(p + name + ".bias", {out});
    };
    proj(L.q, "self_attn.q_proj", nq * D, H, arch.qkv_bias);
    proj(L.k, "self_attn.k_proj", nkv * D, H, arch.qkv_bias);
    proj(L.v, "self_attn.v_proj", nkv * D, H, arch.qkv_bias);
    proj(L.o, "self_attn.o_proj", H, nq * D, arch.o_bias);
    if (arch.qk_norm) {
      L.q_norm = T(p + "self_attn.q_norm.weight", {D});
      L.k_norm = T(p + "self_attn.k_norm.weight", {D});
    }
    proj(L.gate, "mlp.gate_proj", I, H, arch.mlp_bias);
    proj(L.up, "mlp.up_proj", I, H, arch.mlp_bias);
    proj(L.down, "mlp.down_proj", H, I, arch.mlp_bias);
    layers_.push_back(std::move(L));
  }
  if (cfg.tie_word_embeddings) {
    lm_head_ = embed_;
    if (w.tensors.count("lm_head.weight"))
      take(w, "lm_head.weight", {V, H}, opts, device_, dtype_, nullptr);  // some tied checkpoints store a copy
  } else {
    lm_head_ = T("lm_head.weight", {V, H});
  }
  if (!w.tensors.empty()) {
    std::string names;
    int n = 0;
    for (const auto& kv : w.tensors) {
      if (n++ < 5) names += (names.empty() ? "" : ", ") + ("'" + kv.first + "'");
    }
    fail(
        "WEIGHTS_UNUSED",
        "the checkpoint has " + std::to_string(w.tensors.size()) + " tensor(s) that a " + std::to_string(cfg.num_hidden_layers) +
            "-layer " + arch.model_type + " model does not use: " + names + (w.tensors.size() > 5 ? ", ..." : "") +
            ". config.json does not describe these weights (wrong model_type, num_hidden_layers, tie_word_embeddings or attention_bias?).");
  }
  // Computed in float64 and stored in float32 as HF keeps it.
  inv_freq_ = rope_inv_freq(D, cfg.rope_theta, cfg.rope_scaling, device_).to(at::kFloat);
}

int64_t Qwen3Model::num_parameters() const {
  int64_t n = embed_.numel() + norm_.numel() + (cfg_.tie_word_embeddings ? 0 : lm_head_.numel());
  for (const auto& L : layers_) {
    for (const auto* t : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm})
      if (t->defined()) n += t->numel();
    for (const auto* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
      n += l->weight.numel() + (l->bias.defined() ? l->bias.numel() : 0);
  }
  return n;
}

int64_t Qwen3Model::parameter_bytes() const { return num_parameters() * static_cast<int64_t>(c10::elementSize(dtype_)); }

KVCache Qwen3Model::new_cache(int64_t batch, int64_t capacity) const {
  KVCache c;
  c.capacity = capacity;
  auto o = at::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    c.k.push_back(at::zeros({batch, cfg_.num_key_value_heads, capacity, cfg_.head_dim}, o));
    c.v.push_back(at::zeros({batch, cfg_.num_key_value_heads, capacity, cfg_.head_dim}, o));
  }
  return c;
}

void Qwen3Model::check_ids(const at::Tensor& ids) const {
  if (ids.numel() == 0) return;
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= cfg_.vocab_size)
    fail("TOKEN_OUT_OF_RANGE", "token id " + std::to_string(lo < 0 ? lo : hi) + " is outside the vocabulary: expected ids in [0, " +
                                   std::to_string(cfg_.vocab_size) + "). Use the model's own tokenizer.");
}

at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto xf = x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return w * (xf * at::rsqrt(var + eps)).to(x.scalar_type());
}

at::Tensor Qwen3Model::rms_norm(const at::Tensor& x, const at::Tensor& w) const { return rms_norm_aten(x, w, cfg_.rms_norm_eps); }

at::Tensor Qwen3Model::norm(const at::Tensor& x, const at::Tensor& w, const ForwardOptions& o) const {
  if (o.kernels && !o.train && x.dim() == 3) {  // generation (a decode step, a prefill): the CPU kernel when it applies
    auto y = cpu_rms_norm(x, w, cfg_.rms_norm_eps);
    if (y.defined()) return y;
  }
  return rms_norm(x, w);
}

at::Tensor rope_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t h = x.size(-1) / 2;
  return x * cos + at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1) * sin;
}

at::Tensor Qwen3Model::attention(const Qwen3Layer& L, const at::Tensor& x, const LayerInputs& in, KVCache* cache, int64_t layer) const {
  const auto& cos = in.cos;
  const auto& sin = in.sin;
  const auto& mask = in.mask;
  const auto& fo = in.opts;
  const int64_t B = x.size(0), T = x.size(1), D = cfg_.head_dim;
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  // [B, T, nq*D] -> [B, T, nq, D] -> per-head RMSNorm (Qwen3) -> RoPE (cos/sin [B, T, 1, D]) -> [B, nq, T, D]
  auto q = L.q.forward(x, fo).view({B, T, nq, D});
  auto k = L.k.forward(x, fo).view({B, T, nkv, D});
  auto v = L.v.forward(x, fo).view({B, T, nkv, D});
  at::Tensor qr, kr;
  if (fo.kernels && !fo.train) {  // generation: norm + RoPE fused on the CPU when it applies
    const auto none = at::Tensor();
    qr = cpu_norm_rope(q, cfg_.arch.qk_norm ? L.q_norm : none, cos, sin, cfg_.rms_norm_eps);
    kr = qr.defined() ? cpu_norm_rope(k, cfg_.arch.qk_norm ? L.k_norm : none, cos, sin, cfg_.rms_norm_eps) : none;
  }
  if (qr.defined() && kr.defined()) {
    q = qr.transpose(1, 2).contiguous();  // [B, nq, T, D] (at T = 1 already contiguous: no copy)
    k = kr.transpose(1, 2);
  } else {
    if (cfg_.arch.qk_norm) {
      q = rms_norm(q, L.q_norm);
      k = rms_norm(k, L.k_norm);
    }
    q = rope_aten(q, cos, sin).transpose(1, 2).contiguous();  // [B, nq, T, D]
    k = rope_aten(k, cos, sin).transpose(1, 2);               // [B, nkv, T, D]
  }
  v = v.transpose(1, 2);  // [B, nkv, T, D]
  at::Tensor K, Vv, PK, PV;
  if (cache) {
    const int64_t start = cache->length - cache->prefix;  // in the rows' own positions
    cache->k[layer].narrow(2, start, T).copy_(k);
    cache->v[layer].narrow(2, start, T).copy_(v);
    K = cache->k[layer].narrow(2, 0, start + T);  // [B, nkv, S - prefix, D]
    Vv = cache->v[layer].narrow(2, 0, start + T);
    if (cache->prefix) PK = cache->pk[layer], PV = cache->pv[layer];
  } else {
    K = k;
    Vv = v;
  }
  auto o = grouped_attention(q, K, Vv, mask, fo.kernels && !fo.train, PK, PV);
  return L.o.forward(o.transpose(1, 2).reshape({B, T, nq * D}), fo);
}

at::Tensor Qwen3Model::layer_forward(int64_t layer, const at::Tensor& h0, const LayerInputs& in, KVCache* cache) const {
  const auto& L = layers_[layer];
  auto h = h0 + attention(L, norm(h0, L.input_norm, in.opts), in, cache, layer);
  auto x = norm(h, L.post_norm, in.opts);
  // up before gate: the order GCC gave `silu(gate(x)) * up(x)` (right to left), which LoRA dropout's
  // random draws follow, so that training draws the same masks as before the decode kernel.
  const auto u = L.up.forward(x, in.opts);
  const auto g = L.gate.forward(x, in.opts);
  at::Tensor a;
  if (in.opts.kernels && !in.opts.train) a = cpu_silu_mul(g, u);  // generation: the CPU kernel when it applies
  if (!a.defined()) a = at::silu(g) * u;
  return h + L.down.forward(a, in.opts);
}

std::vector<at::Tensor> Qwen3Model::layer_lora_params(int64_t layer, bool critic) const {
  std::vector<at::Tensor> out;
  for (const auto& [name, lin] : layers_[layer].projections()) {
    (void)name;
    if (const auto& l = critic ? lin->critic : lin->lora) {
      out.push_back(l->A);
      out.push_back(l->B);
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Qwen3Model::named_weights() const {
  std::vector<std::pair<std::string, at::Tensor>> out{{"model.embed_tokens.weight", embed_}, {"model.norm.weight", norm_}};
  if (!cfg_.tie_word_embeddings) out.emplace_back("lm_head.weight", lm_head_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto& L = layers_[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.emplace_back(p + "input_layernorm.weight", L.input_norm);
    out.emplace_back(p + "post_attention_layernorm.weight", L.post_norm);
    if (L.q_norm.defined()) out.emplace_back(p + "self_attn.q_norm.weight", L.q_norm);
    if (L.k_norm.defined()) out.emplace_back(p + "self_attn.k_norm.weight", L.k_norm);
    for (const auto& [name, lin] : L.projections()) {
      const std::string base = p + ((name == "gate_proj" || name == "up_proj" || name == "down_proj") ? "mlp." : "self_attn.") + name;
      out.emplace_back(base + ".weight", lin->weight);
      if (lin->bias.defined()) out.emplace_back(base + ".bias", lin->bias);
    }
  }
  return out;
}

bool Qwen3Model::has_adapter() const {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (!layer_lora_params(static_cast<int64_t>(i)).empty()) return true;
  return false;
}

at::Tensor Qwen3Model::hidden(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_mask, KVCache* cache) const {
  // With a KV cache this is generation, which may use the CPU kernels (ForwardOptions::kernels).
  ForwardOptions o;
  o.kernels = cache != nullptr;
  return hidden(ids, positions, key_mask, cache, o);
}

at::Tensor Qwen3Model::hidden(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_mask, KVCache* cache,
                              const ForwardOptions& opts) const {
  const int64_t B = ids.size(0), T = ids.size(1);
  const int64_t S = (cache ? cache->length : 0) + T;
  if (key_mask.size(0) != B || key_mask.size(1) != S)
    fail("ARGUMENT_INVALID",
         "key mask must be [" + std::to_string(B) + ", " + std::to_string(S) + "], found " + shape_str(key_mask.sizes()) + ".");
  if (cache && S > cache->capacity)
    fail("ARGUMENT_INVALID",
         "the KV cache holds " + std::to_string(cache->capacity) + " positions; " + std::to_string(S) + " were needed.");
  check_ids(ids);
  auto fo = at::TensorOptions().dtype(at::kFloat).device(device_);
  // Additive mask [B, 1, T, S]: query t sits at key index S - T + t and sees keys j <= that index
  // that are not padding. Masked entries get the lowest float (as HF), so a fully padded query row
  // yields a uniform distribution instead of NaN.
  auto qidx = at::arange(S - T, S, fo.dtype(at::kLong)).view({1, T, 1});
  auto kidx = at::arange(0, S, fo.dtype(at::kLong)).view({1, 1, S});
  auto allowed = (kidx <= qidx).logical_and(key_mask.to(device_).to(at::kBool).view({B, 1, S}));  // [B, T, S]
  auto mask = at::zeros({B, T, S}, fo).masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest()).unsqueeze(1);
  // RoPE tables [B, T, 1, D] from explicit positions (HF: freqs = pos * inv_freq, emb = cat(freqs, freqs)).
  auto freqs = positions.to(device_).to(at::kFloat).unsqueeze(-1) * inv_freq_.view({1, 1, -1});  // [B, T, D/2]
  auto emb = at::cat({freqs, freqs}, -1);
  LayerInputs in{emb.cos().to(dtype_).unsqueeze(2), emb.sin().to(dtype_).unsqueeze(2), mask, opts};
  auto h = at::embedding(embed_, ids.to(device_));  // [B, T, hidden]
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (opts.checkpoint && !cache && at::GradMode::is_enabled())
      h = checkpointed_layer(*this, static_cast<int64_t>(i), h, in);  // recomputed in backward (checkpoint.cc)
    else
      h = layer_forward(static_cast<int64_t>(i), h, in, cache);
  }
  if (cache) cache->length += T;
  return norm(h, norm_, opts);
}

at::Tensor vocab_logits(const at::Tensor& hidden, const at::Tensor& head, bool kernels, const at::Tensor& buf) {
  if (kernels) {
    auto y = cpu_small_linear(hidden, head, /*float_out=*/true, buf);
    if (y.defined()) return y;
  }
  // No kernel (another device, more rows, or declined): the linear layer's other paths.
  return Linear{head, at::Tensor(), nullptr, nullptr}.forward(hidden, ForwardOptions{}).to(at::kFloat);
}

at::Tensor Qwen3Model::logits(const at::Tensor& hidden, bool kernels, const at::Tensor& buf) const {
  return vocab_logits(hidden, lm_head_, kernels, buf);
}

}  // namespace slm
