// Per-layer gradient checkpointing. libtorch 1.13's C++ API has no checkpoint helper, so this is a
// custom autograd function: forward runs the layer without recording a graph and saves only the
// layer's input; backward recomputes the layer with grad enabled (restoring the random state, so
// LoRA dropout draws the same mask) and differentiates it with respect to its input and the layer's
// LoRA tensors. Peak activation memory drops from one graph per layer to one layer's graph.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/qwen3.h"

namespace slm {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class CheckpointLayer : public torch::autograd::Function<CheckpointLayer> {
 public:
  // params: the layer's LoRA tensors, passed so that autograd routes their gradients through us.
  // cos/sin/mask are saved with the node (they are shared by all layers, so this costs no copy).
  static at::Tensor forward(AutogradContext* ctx, at::Tensor h, at::TensorList params, at::Tensor cos, at::Tensor sin, at::Tensor mask,
                            int64_t model_ptr, int64_t layer, bool adapter, bool train, bool critic) {
    (void)params;
    const auto* model = reinterpret_cast<const Qwen3Model*>(model_ptr);
    ctx->saved_data["model"] = model_ptr;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["adapter"] = adapter;
    ctx->saved_data["train"] = train;
    ctx->saved_data["critic"] = critic;
    ctx->saved_data["rng"] = at::globalContext().defaultGenerator(h.device()).get_state();
    ctx->save_for_backward({h, cos, sin, mask});
    ForwardOptions fo{adapter, train, true};
    fo.critic = critic;
    LayerInputs in{cos, sin, mask, fo};
    return model->layer_forward(layer, h, in, nullptr);  // grad mode is off in a custom forward
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto* model = reinterpret_cast<const Qwen3Model*>(ctx->saved_data["model"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    ForwardOptions fo{ctx->saved_data["adapter"].toBool(), ctx->saved_data["train"].toBool(), true};
    fo.critic = ctx->saved_data["critic"].toBool();
    LayerInputs in{saved[1], saved[2], saved[3], fo};
    auto params = model->layer_lora_params(layer, fo.critic);
    // Replay the forward's random stream (dropout), then put the current stream back.
    auto gen = at::globalContext().defaultGenerator(h.device());
    auto now = gen.get_state();
    gen.set_state(ctx->saved_data["rng"].toTensor());
    at::Tensor x, y;
    {
      at::AutoGradMode enable(true);
      x = h.detach().requires_grad_(h.requires_grad());
      y = model->layer_forward(layer, x, in, nullptr);
    }
    gen.set_state(now);
    variable_list inputs;
    if (x.requires_grad()) inputs.push_back(x);
    for (const auto& p : params) inputs.push_back(p);
    variable_list grads;
    if (!inputs.empty() && y.requires_grad())
      grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    else
      grads.resize(inputs.size());
    variable_list out;
    size_t g = 0;
    out.push_back(x.requires_grad() ? grads[g++] : at::Tensor());
    for (size_t i = 0; i < params.size(); ++i) out.push_back(grads[g++]);
    for (int i = 0; i < 8; ++i) out.push_back(at::Tensor());  // cos, sin, mask, model, layer, adapter, train, critic
    return out;
  }
};

}  // namespace

at::Tensor checkpointed_layer(const Qwen3Model& m, int64_t layer, const at::Tensor& h, const LayerInputs& in) {
  // The adapter the forward uses: the separate critic's (ForwardOptions::critic) or the actor's.
  auto params = m.layer_lora_params(layer, in.opts.critic && !in.opts.reference);
  return CheckpointLayer::apply(h, at::TensorList(params), in.cos, in.sin, in.mask, reinterpret_cast<int64_t>(&m), layer, in.opts.adapter,
                                in.opts.train, in.opts.critic);
}

}  // namespace slm
