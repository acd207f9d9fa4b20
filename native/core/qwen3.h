// The decoder shared by Qwen3, Qwen2/2.5 and Llama 3.x, computed as Hugging Face's modeling_qwen3.py,
// modeling_qwen2.py and modeling_llama.py compute it (one block; ModelArch switches the differences):
//   h = embed(ids)
//   per layer:  h = h + o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v))   (pre-norm: input_layernorm)
//               h = h + down(silu(gate(x)) * up(x))                         (x = post_attention_layernorm(h))
//   logits = lm_head(norm(h))   (lm_head = embed_tokens when tie_word_embeddings)
// RMSNorm runs in float32 and casts back; q/k norms (Qwen3 only) are per head, before RoPE; q/k/v
// carry biases in Qwen2 (and o/MLP in configs with attention_bias / mlp_bias); RoPE is rotate-half
// with inv_freq = 1 / theta^(2i/head_dim), rescaled per frequency band for rope_type llama3;
// attention is grouped-query (num_heads / num_kv_heads queries per key/value head), softmax in
// float32. Nothing here assumes a device: weights and activations live on `device` and every new
// tensor is created with the options of an existing one.
#pragma once
#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "core/value_head.h"

namespace slm {

// What distinguishes the supported architectures inside the one decoder block. The authoritative
// table (model_type -> switches) is lib/model/config.ts, which passes the switches; the native side
// only re-checks the names (kModelTypes, kRopeTypes) so that a caller bypassing it fails clearly.
struct ModelArch {
  std::string model_type = "qwen3";  // one of kModelTypes
  bool qk_norm = true;               // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool qkv_bias = false;             // biases on q_proj, k_proj, v_proj (Qwen2; attention_bias elsewhere)
  bool o_bias = false;               // bias on o_proj (attention_bias in Qwen3 / Llama)
  bool mlp_bias = false;             // biases on gate/up/down_proj (Llama's mlp_bias)
};

// config.json's rope_scaling: "default" (none) or Llama 3.1's "llama3" frequency-band rescaling.
struct RopeScaling {
  std::string type = "default";  // one of kRopeTypes
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

extern const std::vector<std::string> kModelTypes;  // {"qwen3", "qwen2", "llama"}
extern const std::vector<std::string> kRopeTypes;   // {"default", "llama3"}

// Raises MODEL_TYPE_UNSUPPORTED / MODEL_CONFIG_INVALID for names or values the block does not implement.
void check_arch(const ModelArch& arch, const RopeScaling& rope);

// inv_freq [head_dim / 2] (float64) for rope_theta and the scaling, as HF's ROPE_INIT_FUNCTIONS compute it.
at::Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& rope, at::Device device);

struct Qwen3Config {
  ModelArch arch;
  RopeScaling rope_scaling;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
};

struct LoadOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype: float32, bfloat16 (or float16 on CUDA)
  std::string device = "cpu";         // "cpu", "cuda", "cuda:1", ...
};

// How a forward pass runs: with or without the adapter, in training mode (LoRA dropout active), with
// per-layer gradient checkpointing, or as the KL reference policy (`reference`: the frozen reference
// adapter where one was set, e.g. the SFT adapter an RL stage starts from, else the base weights).
struct ForwardOptions {
  bool adapter = true;
  bool train = false;
  bool checkpoint = false;
  bool reference = false;
  // The CPU small-row kernels (core/cpu_gemm.h) may compute the linear layers: generation only.
  // Teacher-forced passes (log-probs, values, embeddings, logits) and training keep to ATen, so that
  // a sequence's log-probs and values equal the training forward's bit for bit.
  bool kernels = false;
  // PPO's separate critic (core/critic.h): the critic's adapter (Linear::critic) in place of the
  // actor's, on the same frozen base weights. Ignored by reference forwards.
  bool critic = false;
};

// A LoRA adapter on one projection: y += scale * B(A(dropout(x))), A [r, in], B [out, r], kept in
// float32 whatever the compute dtype (trainable parameters are optimised in float32).
struct LoraWeights {
  at::Tensor A, B;
  double scale = 1.0;
  double dropout = 0.0;
};

struct Linear {
  at::Tensor weight;                  // [out, in], frozen
  at::Tensor bias;                    // [out], frozen; undefined when the projection has none
  std::shared_ptr<LoraWeights> lora;  // null when this projection has no adapter
  // A frozen copy of an adapter, used by reference forwards (ForwardOptions::reference); null = the
  // reference is the base weights. Attaching, loading or detaching the trained adapter leaves it.
  std::shared_ptr<const LoraWeights> reference;
  // PPO's separate critic: a second trainable adapter on the same frozen weight (ForwardOptions::critic);
  // null when the critic shares the actor's adapter.
  std::shared_ptr<LoraWeights> critic;
  at::Tensor forward(const at::Tensor& x, const ForwardOptions& o = {}) const;
};

struct Qwen3Layer {
  at::Tensor input_norm, post_norm, q_norm, k_norm;  // [hidden], [hidden], [head_dim], [head_dim] (q/k: Qwen3 only)
  Linear q, k, v, o, gate, up, down;
  // The projections by their Hugging Face / PEFT names (q_proj, ..., down_proj).
  std::vector<std::pair<std::string, Linear*>> projections();
  std::vector<std::pair<std::string, const Linear*>> projections() const;
};

// Grouped-query attention: q [B, n_q, T, D], k/v [B, n_kv, S, D], mask [B, 1, T, S] additive float32;
// softmax(q·kᵀ / sqrt(D) + mask)·v as [B, n_q, T, D], query head h reading KV head h / (n_q / n_kv).
// `kernels` (generation): the fused CPU kernel may run it (core/cpu_attention.h). With pk/pv
// [1, n_kv, P, D], a prefix shared by every row comes before k/v's S positions (mask [B, 1, T, P + S]).
at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, bool kernels,
                             const at::Tensor& pk = {}, const at::Tensor& pv = {});

// ATen's RMSNorm over the last dimension, w * T(x * rsqrt(mean(x^2) + eps)) with the sum in float32
// (T: x's dtype), and rotate-half RoPE, x * cos + rotate_half(x) * sin: the model's path wherever the
// CPU kernels (core/cpu_norm.h) do not run, and their reference.
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor rope_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Per-call tensors shared by every layer: rotary tables and the additive attention mask.
struct LayerInputs {
  at::Tensor cos, sin, mask;
  ForwardOptions opts;
};

// Per-layer key/value cache for batched decoding: [B, n_kv, capacity, head_dim] each.
struct KVCache {
  std::vector<at::Tensor> k, v;    // per layer [B, n_kv, capacity - prefix, D]: each row's own positions
  std::vector<at::Tensor> pk, pv;  // per layer [1, n_kv, prefix, D]: positions [0, prefix), shared by every row
  int64_t prefix = 0;
  int64_t length = 0;                      // positions filled, the prefix included
  int64_t capacity = 0;                    // positions, the prefix included
  void keep_rows(const at::Tensor& rows);  // compaction: keep only these batch rows (int64 on device)
  // A one-row cache whose `length` positions become the prefix shared by `rows` rows (cascade
  // attention: stored and read once, not copied per row); the rows' own positions start empty.
  void share_prefix(int64_t rows);
  // Row `row`'s keys and values at positions `idx` (int64, ascending, the prefix's included), per
  // layer [n_kv, idx.size(0), D], in memory of their own.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> row_past(int64_t row, const at::Tensor& idx) const;
};

// hidden [.., hidden] -> float32 logits through the vocabulary head `head` [vocab, hidden]: the CPU
// kernel (written into `buf` when it is a large enough float32 buffer) when `kernels` and it
// applies, else the linear layer's other paths. Qwen3Model::logits is this with the model's head.
at::Tensor vocab_logits(const at::Tensor& hidden, const at::Tensor& head, bool kernels, const at::Tensor& buf = at::Tensor());

class Qwen3Model {
 public:
  // Takes the tensors of a checkpoint, checks every name and shape against the config (each tensor
  // must be used: WEIGHTS_UNUSED / WEIGHTS_MISSING / WEIGHTS_MISMATCH name the tensor) and moves
  // them to the device and dtype (no copy when they already match, e.g. BF16 weights on CPU).
  Qwen3Model(const Qwen3Config& cfg, TensorMap&& weights, const LoadOptions& opts);

  const Qwen3Config& config() const { return cfg_; }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_parameters() const;
  int64_t parameter_bytes() const;

  KVCache new_cache(int64_t batch, int64_t capacity) const;

  // ids [B, T] int64, positions [B, T] int64, key_mask [B, S] (S = cache->length + T, or T without a
  // cache; 1 = real token, 0 = padding) -> final hidden states [B, T, hidden] (after the last norm).
  // With a cache, the new keys/values are written at [length, length + T) and length advances.
  at::Tensor hidden(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_mask, KVCache* cache) const;
  // hidden [.., hidden] -> logits [.., vocab] in float32. Where the CPU kernels apply, written into
  // `buf` when it is a large enough float32 buffer (a decode loop passes the same one every step, so
  // its pages are faulted in once) — the result is then a view of it.
  at::Tensor logits(const at::Tensor& hidden, bool kernels = false, const at::Tensor& buf = at::Tensor()) const;
  // The vocab head's weight [vocab, hidden] (the embedding when tied).
  const at::Tensor& head_weight() const { return lm_head_; }

  // Same as hidden() with explicit options (adapter on/off, training, checkpointing).
  at::Tensor hidden(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_mask, KVCache* cache,
                    const ForwardOptions& opts) const;

  // Raises TOKEN_OUT_OF_RANGE when an id is outside [0, vocab_size).
  void check_ids(const at::Tensor& ids) const;

  // One decoder block: h [B, T, hidden] -> h [B, T, hidden].
  at::Tensor layer_forward(int64_t layer, const at::Tensor& h, const LayerInputs& in, KVCache* cache) const;

  std::vector<Qwen3Layer>& layers() { return layers_; }
  const std::vector<Qwen3Layer>& layers() const { return layers_; }
  // The LoRA tensors of one layer (A then B of each adapted projection), in a fixed order: the
  // actor's adapter, or with `critic` the separate critic's.
  std::vector<at::Tensor> layer_lora_params(int64_t layer, bool critic = false) const;
  bool has_adapter() const;
  // Whether a separate critic adapter is attached (core/critic.h; defined in critic.cc).
  bool has_critic() const;
  // Every base weight by its Hugging Face name (for merged export).
  std::vector<std::pair<std::string, at::Tensor>> named_weights() const;

  // PPO value head on the final hidden states (core/value_head.h); undefined when absent. With a
  // separate critic it reads the critic's hidden states (the critic adapter's forward).
  ValueHead value_head;

 private:
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w) const;
  // rms_norm, or in a decode step (one position, generation's options) the CPU kernel of core/cpu_norm.h.
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const ForwardOptions& o) const;
  at::Tensor attention(const Qwen3Layer& L, const at::Tensor& x, const LayerInputs& in, KVCache* cache, int64_t layer) const;

  Qwen3Config cfg_;
  at::Device device_;
  at::ScalarType dtype_;
  at::Tensor embed_;     // [vocab, hidden]
  at::Tensor lm_head_;   // [vocab, hidden] (same storage as embed_ when tied)
  at::Tensor norm_;      // [hidden]
  at::Tensor inv_freq_;  // [head_dim / 2] float32
  std::vector<Qwen3Layer> layers_;
};

at::ScalarType parse_compute_dtype(const std::string& s);

// A decoder layer whose activations are not kept for backward: the layer is recomputed from its
// saved input when the gradient arrives (custom autograd function, checkpoint.cc).
at::Tensor checkpointed_layer(const Qwen3Model& m, int64_t layer, const at::Tensor& h, const LayerInputs& in);

}  // namespace slm
