#!/usr/bin/env bash
# GPU verification kit for tf_glp's layer concurrency, for a machine
# with nvcc and an NVIDIA driver but no TensorFlow:
#   1. builds the framework-agnostic core (cc/core) with the host compiler and
#      the CUDA backend (cc/cuda/*.cu) plus cc/tests/cuda_lanes_test.cu with
#      nvcc alone - no TensorFlow headers anywhere;
#   2. runs the CPU core tests (cc/tests/concurrent_layers_test.cc);
#   3. runs the GPU tests (stream pool reuse, fork/join ordering, conv and
#      matmul against the CPU core, bitwise equality over k = 1..8 streams,
#      built-in GEMM vs CPU, more row tiles than grid.y holds) and prints a
#      timing table for k = 1, 2, 4, 8 streams; then the tests again with the
#      built-in GEMM (TF_GLP_CUDA_GEMM=builtin). It prints the driver version
#      first (code built by nvcc 13 needs an R580 or newer driver) and each
#      run's GEMM (cuBLAS or built-in).
# Usage: tools/gpu_check.sh [--compile-only] [--no-timing] [--out DIR] [--print-flags]
#   --compile-only  build everything, run nothing (works without a GPU).
#   --print-flags   print the compiler flags (read from third_party/flags.bzl).
#   --out DIR       also write DIR/gpu_check.txt (this output) and
#                   DIR/gpu_check.json (driver and CUDA versions, device,
#                   each test's result per GEMM, the k = 1, 2, 4, 8 timings);
#                   $OUT, when set (the device machine sets it), is the
#                   default DIR.
# Environment: NVCC (default nvcc on PATH, then /usr/local/cuda/bin/nvcc),
#   CXX (default g++), CUDA_ARCHS (e.g. "80 90"; default: the local GPU's, or
#   80 for --compile-only), BUILD_DIR (default build/gpu_check).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMPILE_ONLY=0
PRINT_FLAGS=0
TEST_ARGS=()
OUT_DIR="${OUT:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --compile-only) COMPILE_ONLY=1 ;;
    --no-timing) TEST_ARGS+=(--no-timing) ;;
    --print-flags) PRINT_FLAGS=1 ;;
    --out) [[ $# -ge 2 ]] || { echo "gpu_check.sh: --out needs a folder" >&2; exit 2; }; OUT_DIR="$2"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

# The flags are defined once, in third_party/flags.bzl (as setup.py and CMake
# read them): the quoted items of the literal list on the line of `$1`.
bzl_list() {
  local items
  items="$(sed -n "s/^ *$1 *\[\(.*\)\],\{0,1\}$/\1/p" "$ROOT/third_party/flags.bzl" | tr -d '",')"
  [[ -n "$items" ]] || { echo "gpu_check.sh: third_party/flags.bzl has no list for $1" >&2; exit 2; }
  echo "$items"
}
read -r -a COMMON_FLAGS <<< "$(bzl_list 'COMMON_FLAGS =')"
read -r -a X86_FLAGS <<< "$(bzl_list 'X86_FLAGS =')"
read -r -a AVX2_FLAGS <<< "$(bzl_list '"_avx2\.cc":')"
read -r -a AVX512_FLAGS <<< "$(bzl_list '"_avx512\.cc":')"
# (A failed lookup above only empties its array: check them all.)
[[ ${#COMMON_FLAGS[@]} -gt 0 && ${#X86_FLAGS[@]} -gt 0 && ${#AVX2_FLAGS[@]} -gt 0 && ${#AVX512_FLAGS[@]} -gt 0 ]] ||
  { echo "gpu_check.sh: could not read the flags from third_party/flags.bzl" >&2; exit 2; }
if [[ $PRINT_FLAGS == 1 ]]; then
  echo "COMMON_FLAGS ${COMMON_FLAGS[*]}"
  echo "X86_FLAGS ${X86_FLAGS[*]}"
  echo "_avx2.cc ${AVX2_FLAGS[*]}"
  echo "_avx512.cc ${AVX512_FLAGS[*]}"
  exit 0
fi

# With an output folder: the whole text output goes to gpu_check.txt there
# too, and gpu_check.json (tools/gpu_check_summary.py) is written from it on
# exit, whatever the outcome.
if [[ -n "$OUT_DIR" ]]; then
  mkdir -p "$OUT_DIR"
  OUT_DIR="$(cd "$OUT_DIR" && pwd)"
  exec > >(tee "$OUT_DIR/gpu_check.txt") 2>&1
  summarize() {
    local status=$?
    sleep 0.2  # let tee drain
    python3 "$ROOT/tools/gpu_check_summary.py" "$OUT_DIR/gpu_check.txt" --exit-status "$status" \
      > "$OUT_DIR/gpu_check.json" || echo "gpu_check.sh: could not write $OUT_DIR/gpu_check.json" >&2
    echo "== summary: $OUT_DIR/gpu_check.json, log: $OUT_DIR/gpu_check.txt"
    exit "$status"
  }
  trap summarize EXIT
fi

NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CXX="${CXX:-g++}"
[[ -x "$NVCC" ]] || { echo "gpu_check.sh: nvcc not found (set NVCC)" >&2; exit 2; }
BUILD_DIR="${BUILD_DIR:-$ROOT/build/gpu_check}"
mkdir -p "$BUILD_DIR"

if [[ -z "${CUDA_ARCHS:-}" ]]; then
  CUDA_ARCHS=80
  if [[ $COMPILE_ONLY == 0 ]] && command -v nvidia-smi >/dev/null; then
    cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')"
    [[ -n "$cap" ]] && CUDA_ARCHS="$cap"
  fi
fi
GENCODE=()
for arch in $CUDA_ARCHS; do GENCODE+=("-gencode=arch=compute_${arch},code=sm_${arch}"); done

CXXFLAGS=(-std=c++17 "${COMMON_FLAGS[@]}" -I"$ROOT")
if [[ "$(uname -m)" == x86_64 ]]; then CXXFLAGS+=("${X86_FLAGS[@]}"); fi
NVCCFLAGS=(-x cu -std=c++17 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC -Xcompiler -ffp-contract=off -I"$ROOT" "${GENCODE[@]}")

echo "== building the core with $CXX, CUDA code with $NVCC ($("$NVCC" --version | tail -1)), archs: $CUDA_ARCHS"
start=$SECONDS
core_objects=()
cuda_objects=()
pids=()
for src in "$ROOT"/cc/core/*.cc; do
  case "$src" in
    *_avx2.cc) [[ "$(uname -m)" == x86_64 ]] || continue; isa=("${AVX2_FLAGS[@]}") ;;
    *_avx512.cc) [[ "$(uname -m)" == x86_64 ]] || continue; isa=("${AVX512_FLAGS[@]}") ;;
    *) isa=() ;;
  esac
  obj="$BUILD_DIR/$(basename "$src").o"
  core_objects+=("$obj")
  "$CXX" "${CXXFLAGS[@]}" "${isa[@]}" -c "$src" -o "$obj" & pids+=($!)
done
for src in "$ROOT"/cc/cuda/*.cu "$ROOT/cc/tests/cuda_lanes_test.cu"; do
  obj="$BUILD_DIR/$(basename "$src").o"
  cuda_objects+=("$obj")
  "$NVCC" "${NVCCFLAGS[@]}" -c "$src" -o "$obj" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$NVCC" "${GENCODE[@]}" "${cuda_objects[@]}" "${core_objects[@]}" -o "$BUILD_DIR/cuda_lanes_test" -ldl -lpthread
"$CXX" "${CXXFLAGS[@]}" "$ROOT/cc/tests/concurrent_layers_test.cc" "${core_objects[@]}" -o "$BUILD_DIR/concurrent_layers_test"
echo "== built in $((SECONDS - start)) s: $BUILD_DIR/cuda_lanes_test, $BUILD_DIR/concurrent_layers_test"

if [[ $COMPILE_ONLY == 1 ]]; then
  echo "== --compile-only: nothing run"
  exit 0
fi
if command -v nvidia-smi >/dev/null; then
  echo "== driver: $(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader | head -1)" \
       "(code from nvcc $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') needs a driver that supports" \
       "that CUDA version: R580+ for CUDA 13; otherwise the first launch fails with 'driver version is insufficient')"
else
  echo "== driver: nvidia-smi not found"
fi
# The test binary finds cuBLAS by soname (as inside TensorFlow): point the
# loader at the toolkit's libraries.
CUDA_LIB="$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)/lib64"
export LD_LIBRARY_PATH="$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== CPU core tests"
"$BUILD_DIR/concurrent_layers_test"
echo "== GPU tests (cuBLAS where it loads)"
status=0
timeout 240 "$BUILD_DIR/cuda_lanes_test" "${TEST_ARGS[@]}" || status=$?
echo "== GPU tests with the built-in GEMM (TF_GLP_CUDA_GEMM=builtin)"
TF_GLP_CUDA_GEMM=builtin timeout 240 "$BUILD_DIR/cuda_lanes_test" --no-timing || status=$?
if command -v python3 >/dev/null; then
  python3 "$ROOT/tools/gpu_describe.py" || status=1
else
  echo "== profiler's GPU model: not checked (no python3)"
fi
exit $status
