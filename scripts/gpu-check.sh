#!/usr/bin/env bash
# The GPU check (issue 35, item 1), one command, no Node.js: builds slm_core and native/check/gpu_check.cc
# (the CMake project native/check/, not the addon) against the libtorch of an installed PyTorch or a
# libtorch folder, then runs the forward parity checks on the device named.
#
#   scripts/gpu-check.sh [--device cpu|cuda[:N]] [--libtorch DIR] [--build DIR] [--fixtures DIR] [--json FILE]
#                        [--no-transformers] [--no-peft] [--bench 4b|tiny [--no-peer]] [--build-only] [--stage]
#
#   --device      where the model runs (default cpu)
#   --libtorch    a libtorch folder (holding share/cmake/Torch); default: the PyTorch of $PYTHON (python3)
#   --build       the build folder (default .gpu-check/build-<hash of the libtorch path>; never build/)
#   --fixtures    the folder holding qwen3/golden.json (default .gpu-check/carry/fixtures when staged,
#                 else $SLM_SHARED_DIR/fixtures, else ../shared/fixtures)
#   --json        also write the results as JSON there
#   --no-transformers  skip the comparison with transformers' forward
#   --no-peft     skip the LoRA step against PEFT + torch (test/reference/peft_step.py, on the CPU)
#   --bench       also benchmark a random bfloat16 model: 4b = Qwen3-4B's shape (36 layers; ~8 GiB of
#                 weights: a GPU), tiny = a small one (the CPU test); beside the device's copy rate and
#                 bf16 matmul rate, and beside transformers' own generate / forward / PEFT step on the
#                 same shape and device (bench/hf_peer.py) unless --no-peer or transformers is missing
#   --build-only  configure and build, then stop (a later call with the same --build runs the checks)
#   --stage       copy what a machine without network lacks into .gpu-check/carry (the fixtures and the
#                 nlohmann-json headers, about 3 MB) and stop: carry that folder (device tool: carry
#                 [".gpu-check/carry"]) and run this script there.
# Environment: PYTHON (default python3), JOBS (parallel compile jobs, default nproc), CMAKE_GENERATOR.
# Exit status: 0 all checks passed, 1 a check failed, 2 a setup / build error.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
device=cpu libtorch= build= fixtures= json= use_hf=1 stage=0 use_peft=1 bench= use_peer=1 build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --libtorch) libtorch=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --fixtures) fixtures=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --no-transformers) use_hf=0; shift ;;
    --no-peft) use_peft=0; shift ;;
    --bench) bench=$2; shift 2 ;;
    --no-peer) use_peer=0; shift ;;
    --build-only) build_only=1; shift ;;
    --stage) stage=1; shift ;;
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
say() { echo "gpu-check: $*" >&2; }
carry=$repo/.gpu-check/carry
shared_fixtures=${SLM_SHARED_DIR:-$repo/../shared}/fixtures

if [ $stage = 1 ]; then
  [ -f "$shared_fixtures/qwen3/golden.json" ] || { say "no fixtures at $shared_fixtures"; exit 2; }
  hdr=
  for d in /usr/include /usr/local/include; do [ -f $d/nlohmann/json.hpp ] && hdr=$d/nlohmann && break; done
  [ -n "$hdr" ] || { say "no nlohmann/json.hpp in /usr/include or /usr/local/include (apt-get install nlohmann-json3-dev)"; exit 2; }
  rm -rf "$carry" && mkdir -p "$carry/fixtures" "$carry/include"
  cp -r "$shared_fixtures/qwen3" "$carry/fixtures/" && cp -r "$hdr" "$carry/include/"
  say "staged $(du -sh "$carry" | cut -f1) in $carry (carry .gpu-check/carry; .gpu-check/ is git-ignored)"
  exit 0
fi

# libtorch: a folder, or the installed PyTorch's, with the CUDA toolkit's arguments for a CUDA PyTorch
# (scripts/lib/torch-cmake.sh, shared with scripts/gpu-trainer.sh).
. "$repo/scripts/lib/torch-cmake.sh"
torch_cmake "$PYTHON" "$libtorch" || { say "$TORCH_NOTE"; exit 2; }
[ -n "$TORCH_NOTE" ] && say "$TORCH_NOTE"
prefix=$TORCH_PREFIX torch_desc=$TORCH_DESC
if [ -z "$build" ]; then
  build=$repo/.gpu-check/build-$(printf %s "$prefix" | cksum | cut -d' ' -f1)
fi
case "$(cd "$(dirname "$build")" 2>/dev/null && pwd)/$(basename "$build")" in
  "$repo/build"|"$repo/build/"*) say "refusing --build $build: build/ holds the addon build"; exit 2 ;;
esac
if [ -z "$fixtures" ]; then
  if [ -f "$carry/fixtures/qwen3/golden.json" ]; then fixtures=$carry/fixtures; else fixtures=$shared_fixtures; fi
fi
[ -f "$fixtures/qwen3/golden.json" ] || { say "no qwen3/golden.json under $fixtures (pass --fixtures DIR, or run --stage where ../shared exists)"; exit 2; }

cmake_args=(-S "$repo/native/check" -B "$build" -DCMAKE_BUILD_TYPE=Release "${TORCH_CMAKE_ARGS[@]}")
if [ -f "$carry/include/nlohmann/json.hpp" ] && ! [ -f /usr/include/nlohmann/json.hpp ]; then
  cmake_args+=("-DSLM_JSON_INCLUDE=$carry/include")
fi
# Extra CMake arguments from the environment (SLM_CHECK_CMAKE_ARGS, split on spaces).
[ -n "${SLM_CHECK_CMAKE_ARGS:-}" ] && read -r -a extra <<<"$SLM_CHECK_CMAKE_ARGS" && cmake_args+=("${extra[@]}")
if [ -z "${CMAKE_GENERATOR:-}" ] && [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then cmake_args+=(-G Ninja); fi
say "building against $torch_desc in $build"
mkdir -p "$build"
cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; say "configure failed"; exit 2; }
cmake --build "$build" --target gpu_check -j "${JOBS:-$(nproc)}" >"$build/build.log" 2>&1 || { tail -n 60 "$build/build.log" >&2; say "build failed (log: $build/build.log)"; exit 2; }
[ $build_only = 1 ] && { say "built $build/gpu_check (--build-only)"; exit 0; }

# reference SCRIPT OUT KEY=VALUE...: test/reference/SCRIPT reads OUT.request.json and writes OUT, with the
# KEY=VALUE pairs (the library versions) added to its JSON; its stderr goes to OUT.log (tail shown on failure).
reference() {
  local script=$1 out=$2
  shift 2
  if "$PYTHON" "$repo/test/reference/$script" <"$out.request.json" >"$out.tmp" 2>"$out.log" &&
    "$PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1]))
d.update(kv.split("=", 1) for kv in sys.argv[3:])
json.dump(d, open(sys.argv[2], "w"))' "$out.tmp" "$out" "$@"; then
    return 0
  fi
  tail -n 5 "$out.log" >&2
  return 1
}

# transformers' forward on the fixture checkpoints (float32), through test/reference/hf_forward.py.
args=(--device "$device" --fixtures "$fixtures")
if [ $use_hf = 0 ]; then
  args+=(--unchecked "transformers' forward (--no-transformers)")
elif ! hf_version=$("$PYTHON" -c 'import torch, transformers; print(transformers.__version__)' 2>/dev/null); then
  args+=(--unchecked "transformers' forward ($PYTHON cannot import transformers)")
else
  mkdir -p "$build/hf"
  for m in tiny-qwen3-f32 tiny-qwen3-bf16-sharded; do
    [ -d "$fixtures/qwen3/$m" ] || continue
    out=$build/hf/$m.json
    # the golden cases of one row whose positions are 0..T-1, plus a 40-token row
    "$PYTHON" - "$fixtures/qwen3" "$m" >"$out.request.json" <<'EOF'
import json, sys
g = json.load(open(sys.argv[1] + "/golden.json"))
rows = []
for c in g["models"][sys.argv[2]]["cases"]:
    if len(c["input_ids"]) == 1 and c["position_ids"][0] == list(range(len(c["input_ids"][0]))):
        rows.append(c["input_ids"][0])
rows.append([(7 * i + 3) % 500 + 3 for i in range(40)])
json.dump({"model_dir": sys.argv[1] + "/" + sys.argv[2], "dtype": "float32", "rows": rows}, sys.stdout)
EOF
    reference hf_forward.py "$out" "transformers=$hf_version" && args+=(--hf "$m=$out") ||
      args+=(--unchecked "transformers' forward on $m (hf_forward.py failed: $out.log)")
  done
  # Qwen2 (q/k/v biases, untied head) and Llama (llama3 RoPE scaling, tied head): random float32
  # checkpoints written by transformers itself (seeded), then its forward on them.
  mkdir -p "$build/hf-models"
  if "$PYTHON" - "$build/hf-models" >"$build/hf-models/make.log" 2>&1 <<'EOF'
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
base = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, rms_norm_eps=1e-6)
for name, cls, cfg in [
    ("tiny-qwen2", Qwen2ForCausalLM, Qwen2Config(**base, rope_theta=1e6, tie_word_embeddings=False)),
    ("tiny-llama", LlamaForCausalLM, LlamaConfig(**base, head_dim=16, rope_theta=5e5, tie_word_embeddings=True,
                                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
]:
    torch.manual_seed(0)
    m = cls(cfg).to(torch.float32)
    with torch.no_grad():  # biases and norms away from their 0 / 1 initialisation, so that a dropped one shows
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    m.save_pretrained(os.path.join(sys.argv[1], name), safe_serialization=True)
EOF
  then
    for m in tiny-qwen2 tiny-llama; do
      out=$build/hf/$m.json
      printf '{"model_dir": "%s", "dtype": "float32", "rows": [[5, 17, 300, 42, 7, 99, 123, 250, 3, 77, 401, 12, 9, 311, 64, 128, 2], [%s]]}' \
        "$build/hf-models/$m" "$(seq -s, 3 7 283)" >"$out.request.json"
      reference hf_forward.py "$out" "transformers=$hf_version" && args+=(--hf-extra "$out") ||
        args+=(--unchecked "transformers' forward on $m (hf_forward.py failed: $out.log)")
    done
  else
    tail -n 5 "$build/hf-models/make.log" >&2
    args+=(--unchecked "Qwen2 and Llama against transformers (writing their checkpoints failed: $build/hf-models/make.log)")
  fi
fi
# A LoRA step in PEFT + torch on the fixture (float32, CPU): gpu_check repeats it on the device.
if [ $use_peft = 0 ]; then
  args+=(--unchecked "the LoRA step against PEFT (--no-peft)")
elif ! peft_version=$("$PYTHON" -c 'import torch, transformers, peft; print(peft.__version__ + " " + torch.__version__)' 2>/dev/null); then
  args+=(--unchecked "the LoRA step against PEFT ($PYTHON cannot import peft and transformers)")
else
  mkdir -p "$build/peft"
  out=$build/peft/step.json
  "$PYTHON" - "$fixtures/qwen3" >"$out.request.json" <<'EOF'
import json, sys
ids = [204, 125, 373, 399, 458, 17, 300, 457, 205, 161, 12, 99, 300, 7, 45, 210, 3, 77, 41, 5, 6, 90, 91, 92]
json.dump({"model_dir": sys.argv[1] + "/tiny-qwen3-f32", "adapter_dir": sys.argv[1] + "/tiny-lora", "ids": ids,
           "mask": [1 if i >= 8 else 0 for i in range(len(ids))], "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}, sys.stdout)
EOF
  reference peft_step.py "$out" "peft=${peft_version% *}" "torch=${peft_version#* }" && args+=(--peft "$out") ||
    args+=(--unchecked "the LoRA step against PEFT (peft_step.py failed: $out.log)")
fi
# The benchmark and its peer (transformers on the same shape and device), the peer first.
if [ -n "$bench" ]; then
  args+=(--bench "$bench")
  if [ $use_peer = 1 ] && "$PYTHON" -c 'import transformers' 2>/dev/null; then
    say "transformers' peer benchmark ($bench on $device)"
    if "$PYTHON" "$repo/bench/hf_peer.py" "$bench" "$device" >"$build/peer.json" 2>"$build/peer.log"; then
      args+=(--peer "$build/peer.json")
    else
      tail -n 5 "$build/peer.log" >&2
      args+=(--unchecked "transformers' peer benchmark (bench/hf_peer.py failed: $build/peer.log)")
    fi
  else
    args+=(--unchecked "transformers' peer benchmark (--no-peer, or $PYTHON cannot import transformers)")
  fi
fi
[ -n "$json" ] && args+=(--json "$json")
exec "$build/gpu_check" "${args[@]}"
