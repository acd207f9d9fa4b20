# Sourced by the bash scripts that build against an installed PyTorch's libtorch (scripts/gpu-check.sh,
# scripts/gpu-trainer.sh). Defines one function:
#
#   torch_cmake PYTHON [LIBTORCH_DIR]
#
# and sets, on success (return 0):
#   TORCH_PREFIX      the CMAKE_PREFIX_PATH value: "<torch.utils.cmake_prefix_path>;<torch package folder>"
#                     (the torch folder itself too: find_library searches the system before TorchConfig's
#                     hint, so without it Debian's /usr/lib/libtorch.so is linked against pip's headers),
#                     or the libtorch folder given
#   TORCH_DESC        "PyTorch 2.x.y of PYTHON" or "libtorch folder DIR", for messages
#   TORCH_VERSION     torch.__version__ (empty for a libtorch folder)
#   TORCH_CUDA        torch.version.cuda (empty for a CPU build or a libtorch folder)
#   TORCH_CMAKE_ARGS  an array of CMake arguments: -DCMAKE_PREFIX_PATH=..., and for a CUDA PyTorch the
#                     toolkit (CUDA_TOOLKIT_ROOT_DIR, CUDAToolkit_ROOT, CMAKE_CUDA_COMPILER) and, where the
#                     toolkit has no libnvrtc, the one pip installed beside PyTorch (nvidia/*/lib)
#   TORCH_NOTE        a warning to print (empty when none)
# On failure (PYTHON cannot import torch) it returns 1 with TORCH_NOTE saying why.
torch_cmake() {
  local py=$1 libtorch=${2:-} info cuda_root nvrtc
  TORCH_PREFIX= TORCH_DESC= TORCH_VERSION= TORCH_CUDA= TORCH_NOTE=
  TORCH_CMAKE_ARGS=()
  if [ -n "$libtorch" ]; then
    TORCH_PREFIX="$(cd "$libtorch" && pwd)"
    TORCH_DESC="libtorch folder $TORCH_PREFIX"
  else
    info=$("$py" -c 'import os, torch; print(torch.utils.cmake_prefix_path); print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or "")' 2>/dev/null) || {
      TORCH_NOTE="$py cannot import torch: install PyTorch, set PYTHON=/path/to/python, or pass a libtorch folder"
      return 1
    }
    TORCH_PREFIX="$(sed -n 1p <<<"$info");$(sed -n 2p <<<"$info")"
    TORCH_VERSION=$(sed -n 3p <<<"$info")
    TORCH_CUDA=$(sed -n 4p <<<"$info")
    TORCH_DESC="PyTorch $TORCH_VERSION of $py"
  fi
  TORCH_CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=$TORCH_PREFIX")
  # A CUDA PyTorch: its CMake files look for the CUDA toolkit through the nvcc on PATH, which fails when
  # that nvcc is a wrapper outside the toolkit (/usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc);
  # point them at the toolkit (CUDA_TOOLKIT_ROOT_DIR, else CUDA_HOME, else /usr/local/cuda).
  if [ -n "$TORCH_CUDA" ]; then
    cuda_root=${CUDA_TOOLKIT_ROOT_DIR:-${CUDA_HOME:-/usr/local/cuda}}
    if [ -f "$cuda_root/include/cuda_runtime_api.h" ]; then
      TORCH_CMAKE_ARGS+=("-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root" "-DCUDAToolkit_ROOT=$cuda_root")
      [ -x "$cuda_root/bin/nvcc" ] && TORCH_CMAKE_ARGS+=("-DCMAKE_CUDA_COMPILER=$cuda_root/bin/nvcc")
      # libnvrtc: the toolkit's, else the one pip installed beside PyTorch (nvidia/*/lib).
      if ! ls "$cuda_root"/lib64/libnvrtc.so* "$cuda_root"/lib/libnvrtc.so* >/dev/null 2>&1; then
        nvrtc=$("$py" -c 'import glob, os, nvidia; print(next(iter(sorted(f for p in nvidia.__path__ for f in glob.glob(os.path.join(p, "*", "lib", "libnvrtc.so*")) if "builtins" not in f)), ""))' 2>/dev/null || true)
        [ -n "$nvrtc" ] && TORCH_CMAKE_ARGS+=("-DCUDA_nvrtc_LIBRARY=$nvrtc")
      fi
    else
      TORCH_NOTE="a CUDA PyTorch ($TORCH_CUDA), but no CUDA toolkit at $cuda_root (set CUDA_TOOLKIT_ROOT_DIR): CMake may not find it"
    fi
  fi
  return 0
}
