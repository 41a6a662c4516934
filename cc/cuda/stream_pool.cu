// The CUDA stream pool and the lanes' GEMM (cuBLAS through dlopen, or a
// built-in kernel). See stream_pool.h.
#include "cc/cuda/stream_pool.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace tf_glp::cuda {
namespace {

// --- cuBLAS, loaded at run time ---------------------------------------------
// TensorFlow's pip CUDA packages (nvidia-cublas-cu12) install libcublas; when
// TensorFlow runs on a GPU it has loaded it already. Declared here by hand so
// that no cuBLAS header is needed to build.
using BlasStatus = int;
using BlasCreate = BlasStatus (*)(void**);
using BlasDestroy = BlasStatus (*)(void*);
using BlasSetStream = BlasStatus (*)(void*, cudaStream_t);
using BlasSetWorkspace = BlasStatus (*)(void*, void*, size_t);
using BlasSetMathMode = BlasStatus (*)(void*, int);
using BlasSgemm = BlasStatus (*)(void*, int, int, int, int, int, const float*,
                                 const float*, int, const float*, int,
                                 const float*, float*, int);
constexpr int kBlasOpN = 0, kBlasOpT = 1;
constexpr int kBlasDefaultMath = 0;  // no TF32: float32 results
constexpr size_t kBlasWorkspaceBytes = size_t{4} << 20;

struct Cublas {
  bool loaded = false;
  std::string name;
  BlasCreate create = nullptr;
  BlasDestroy destroy = nullptr;
  BlasSetStream set_stream = nullptr;
  BlasSetWorkspace set_workspace = nullptr;
  BlasSetMathMode set_math_mode = nullptr;
  BlasSgemm sgemm = nullptr;
};

// Only the cuBLAS of the CUDA major version this process runs (12 inside
// TensorFlow 2.21, whose CUDA libraries are already loaded by then, so the
// soname finds them): another major version would bring a second CUDA
// runtime into the process.
const Cublas& GetCublas() {
  static const Cublas* blas = [] {
    auto* b = new Cublas;
    // TF_GLP_CUDA_GEMM=builtin: the built-in GEMM everywhere (the kit runs
    // its tests both ways).
    const char* choice = std::getenv("TF_GLP_CUDA_GEMM");
    if (choice != nullptr && std::string(choice) == "builtin") return b;
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) return b;
    const std::string soname = "libcublas.so." + std::to_string(runtime / 1000);
    for (const char* name : {soname.c_str()}) {
      void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) continue;
      b->create = reinterpret_cast<BlasCreate>(dlsym(lib, "cublasCreate_v2"));
      b->destroy = reinterpret_cast<BlasDestroy>(dlsym(lib, "cublasDestroy_v2"));
      b->set_stream = reinterpret_cast<BlasSetStream>(dlsym(lib, "cublasSetStream_v2"));
      b->set_workspace = reinterpret_cast<BlasSetWorkspace>(dlsym(lib, "cublasSetWorkspace_v2"));
      b->set_math_mode = reinterpret_cast<BlasSetMathMode>(dlsym(lib, "cublasSetMathMode"));
      b->sgemm = reinterpret_cast<BlasSgemm>(dlsym(lib, "cublasSgemm_v2"));
      if (b->create && b->destroy && b->set_stream && b->set_workspace && b->set_math_mode && b->sgemm) {
        b->loaded = true;
        b->name = name;
        break;
      }
    }
    return b;
  }();
  return *blas;
}

constexpr int kTile = 16;

// Built-in GEMM: one thread per C element, the in-order sum of
// Note [GEMM determinism] (with FMA), through shared-memory tiles. Column
// tiles on grid.x (up to 2^31 - 1); row tiles on grid.y, looped over when
// there are more than grid.y's 65535.
__global__ void TiledGemmKernel(core::GemmArgs g) {
  __shared__ float a_tile[kTile][kTile + 1];
  __shared__ float b_tile[kTile][kTile + 1];
  const int64_t row_tiles = (g.m + kTile - 1) / kTile;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  for (int64_t row_tile = blockIdx.y; row_tile < row_tiles; row_tile += gridDim.y) {
    const int64_t row = row_tile * kTile + threadIdx.y;
    float acc = (g.accumulate && row < g.m && col < g.n) ? g.c[row * g.ldc + col] : 0.0f;
    for (int64_t p0 = 0; p0 < g.k; p0 += kTile) {
      const int64_t pa = p0 + threadIdx.x;  // A(row, pa)
      const int64_t pb = p0 + threadIdx.y;  // B(pb, col)
      a_tile[threadIdx.y][threadIdx.x] =
          (row < g.m && pa < g.k) ? (g.transpose_a ? g.a[pa * g.lda + row] : g.a[row * g.lda + pa]) : 0.0f;
      b_tile[threadIdx.y][threadIdx.x] =
          (pb < g.k && col < g.n) ? (g.transpose_b ? g.b[col * g.ldb + pb] : g.b[pb * g.ldb + col]) : 0.0f;
      __syncthreads();
      const int64_t steps = g.k - p0 < kTile ? g.k - p0 : kTile;
      for (int64_t p = 0; p < steps; ++p) acc = fmaf(a_tile[threadIdx.y][p], b_tile[p][threadIdx.x], acc);
      __syncthreads();
    }
    if (row < g.m && col < g.n) g.c[row * g.ldc + col] = acc;
  }
}

}  // namespace

bool CublasAvailable(std::string* which) {
  const Cublas& blas = GetCublas();
  if (which != nullptr) *which = blas.loaded ? blas.name : "built-in tiled GEMM";
  return blas.loaded;
}

StreamPool* StreamPool::ForDevice(int device, std::string* error) {
  static std::once_flag once;
  static int device_count = 0;
  static std::unique_ptr<std::once_flag[]> flags;
  static std::unique_ptr<StreamPool*[]> pools;
  static cudaError_t count_status = cudaSuccess;
  std::call_once(once, [] {
    count_status = cudaGetDeviceCount(&device_count);
    if (count_status != cudaSuccess) device_count = 0;
    flags.reset(new std::once_flag[std::max(device_count, 1)]);
    pools.reset(new StreamPool*[std::max(device_count, 1)]());
  });
  if (count_status != cudaSuccess) {
    *error = CudaError("cudaGetDeviceCount", count_status);
    return nullptr;
  }
  if (device < 0 || device >= device_count) {
    *error = "no CUDA device " + std::to_string(device) + " (" + std::to_string(device_count) + " present)";
    return nullptr;
  }
  std::call_once(flags[device], [device] { pools[device] = new StreamPool(device); });
  return pools[device];
}

std::string StreamPool::EnsureLanes(int num_lanes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (num_lanes <= created_) return "";
  int previous = 0;
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const Cublas& blas = GetCublas();
  std::string error;
  // A lane counts as created only when complete: every lane then has cuBLAS
  // or none has (cuBLAS and the built-in GEMM round differently, and results
  // must not depend on which lane ran an item).
  while (created_ < num_lanes && error.empty()) {
    Lane& lane = lanes_[created_];
    cudaError_t status = cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
      error = CudaError("cudaStreamCreateWithFlags", status);
      lane.stream = nullptr;
      break;
    }
    if (blas.loaded) {
      void* handle = nullptr;
      if (blas.create(&handle) != 0 || blas.set_stream(handle, lane.stream) != 0 ||
          blas.set_math_mode(handle, kBlasDefaultMath) != 0 ||
          cudaMalloc(&lane.blas_workspace, kBlasWorkspaceBytes) != cudaSuccess ||
          blas.set_workspace(handle, lane.blas_workspace, kBlasWorkspaceBytes) != 0) {
        // Undone, so that a later call retries this lane from scratch.
        if (handle != nullptr) blas.destroy(handle);
        error = "creating the cuBLAS handle of lane " + std::to_string(created_) + " failed";
        cudaStreamDestroy(lane.stream);
        lane.stream = nullptr;
        if (lane.blas_workspace != nullptr) cudaFree(lane.blas_workspace);
        lane.blas_workspace = nullptr;
        break;
      }
      lane.blas = handle;
    }
    ++created_;
  }
  cudaSetDevice(previous);
  return error;
}

std::string StreamPool::Fork(cudaStream_t parent, int num_lanes) {
  cudaEvent_t ready;
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(ready, parent);
  std::string error = status == cudaSuccess ? "" : CudaError("cudaEventRecord (fork)", status);
  for (int i = 0; i < num_lanes && error.empty(); ++i) {
    status = cudaStreamWaitEvent(lanes_[i].stream, ready, 0);
    if (status != cudaSuccess) error = CudaError("cudaStreamWaitEvent (fork)", status);
  }
  // Released once the recorded work completes; the waits already hold it.
  cudaEventDestroy(ready);
  return error;
}

std::string StreamPool::Join(cudaStream_t parent, int num_lanes) {
  // Every lane is joined even when one fails: TensorFlow may reuse the
  // buffers of this op as soon as its stream passes the join.
  std::string first_error;
  for (int i = 0; i < num_lanes; ++i) {
    cudaEvent_t done;
    cudaError_t status = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (status == cudaSuccess) {
      status = cudaEventRecord(done, lanes_[i].stream);
      if (status == cudaSuccess) status = cudaStreamWaitEvent(parent, done, 0);
      cudaEventDestroy(done);
    }
    if (status != cudaSuccess && first_error.empty()) {
      first_error = CudaError(("joining lane " + std::to_string(i)).c_str(), status);
    }
  }
  return first_error;
}

std::string LaneGemm(Lane& lane, const core::GemmArgs& g, bool force_builtin) {
  if (g.m <= 0 || g.n <= 0) return "";
  const Cublas& blas = GetCublas();
  constexpr int64_t kIntMax = 2147483647;
  const bool fits_int = g.m <= kIntMax && g.n <= kIntMax && g.k <= kIntMax && g.lda <= kIntMax &&
                        g.ldb <= kIntMax && g.ldc <= kIntMax;
  if (lane.blas != nullptr && !force_builtin && g.k > 0) {
    // cuBLAS takes int sizes; every lane must use the same GEMM for a given
    // problem (Note [Work plan]), so a problem cuBLAS cannot take is an error.
    if (!fits_int) {
      return "a GEMM of " + std::to_string(g.m) + " x " + std::to_string(g.n) + " x " + std::to_string(g.k) +
             " exceeds cuBLAS's int sizes";
    }
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    const BlasStatus status = blas.sgemm(
        lane.blas, g.transpose_b ? kBlasOpT : kBlasOpN, g.transpose_a ? kBlasOpT : kBlasOpN,
        static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &alpha, g.b,
        static_cast<int>(g.ldb), g.a, static_cast<int>(g.lda), &beta, g.c, static_cast<int>(g.ldc));
    if (status != 0) return "cublasSgemm failed with status " + std::to_string(status);
    return "";
  }
  const dim3 block(kTile, kTile);
  const int64_t row_tiles = (g.m + kTile - 1) / kTile, col_tiles = (g.n + kTile - 1) / kTile;
  if (col_tiles > kIntMax) return "a GEMM with " + std::to_string(g.n) + " columns is too wide";
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(std::min<int64_t>(row_tiles, 65535)));
  TiledGemmKernel<<<grid, block, 0, lane.stream>>>(g);
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return "";
}

}  // namespace tf_glp::cuda
