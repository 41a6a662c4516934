// CUDA lane pool, GEMM (cuBLAS through dlopen, or a built-in kernel) and the
// concurrent conv / matmul drivers. See lane_pool_cuda.h.
#include "cc/cuda/lane_pool_cuda.h"

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

std::string CudaError(const char* what, cudaError_t status) {
  return std::string(what) + " failed: " + cudaGetErrorString(status);
}

#define TF_GLP_CUDA_RETURN_IF_ERROR(call)                      \
  do {                                                         \
    const cudaError_t tf_glp_status = (call);                  \
    if (tf_glp_status != cudaSuccess) return CudaError(#call, tf_glp_status); \
  } while (0)

// --- kernels -----------------------------------------------------------------

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

__global__ void Im2ColKernel(core::Conv2DShape s, const float* sample, float* col) {
  const int64_t patch = (s.filter_h * s.filter_w * s.in_c);
  const int64_t total = (s.out_h * s.out_w) * patch;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = i / patch, e = i % patch;
    const int64_t c = e % s.in_c, kw = (e / s.in_c) % s.filter_w, kh = e / (s.in_c * s.filter_w);
    const int64_t oh = p / s.out_w, ow = p % s.out_w;
    const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
    const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
    col[i] = (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w) ? sample[(ih * s.in_w + iw) * s.in_c + c] : 0.0f;
  }
}

// Gather form of col2im: one thread per input element sums the patch
// entries that came from it, in (kh, kw) order. No atomics: deterministic.
__global__ void Col2ImKernel(core::Conv2DShape s, const float* col, float* sample) {
  const int64_t total = (s.in_h * s.in_w * s.in_c);
  const int64_t patch = (s.filter_h * s.filter_w * s.in_c);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % s.in_c, iw = (i / s.in_c) % s.in_w, ih = i / (s.in_c * s.in_w);
    float acc = 0.0f;
    for (int64_t kh = 0; kh < s.filter_h; ++kh) {
      const int64_t y = ih + s.pad_top - kh * s.dilation_h;
      if (y < 0 || y % s.stride_h != 0 || y / s.stride_h >= s.out_h) continue;
      for (int64_t kw = 0; kw < s.filter_w; ++kw) {
        const int64_t x = iw + s.pad_left - kw * s.dilation_w;
        if (x < 0 || x % s.stride_w != 0 || x / s.stride_w >= s.out_w) continue;
        const int64_t p = (y / s.stride_h) * s.out_w + x / s.stride_w;
        acc += col[p * patch + (kh * s.filter_w + kw) * s.in_c + c];
      }
    }
    sample[i] = acc;
  }
}

__global__ void SumPartialsKernel(const float* partials, int64_t groups, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = partials[i];
    for (int64_t g = 1; g < groups; ++g) acc += partials[g * count + i];
    out[i] = acc;
  }
}

// 16-bit <-> float32 with the core's rounding (Note [Rounding to 16 bits]).
template <class Half>
__global__ void WidenKernel(const Half* in, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = core::ToFloat(in[i]);
  }
}

template <class Half>
__global__ void NarrowKernel(const float* in, Half* out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    core::FromFloat(in[i], &out[i]);
  }
}

int Blocks(int64_t total) {
  return static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
}

// Makes `device` current for the scope and restores the caller's: the lanes'
// streams, and every kernel launched on them or on the op's stream, belong to
// `device` (TensorFlow normally has it current already).
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {}
  std::string Enter() {
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (previous_ != device_) TF_GLP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    entered_ = true;
    return "";
  }
  ~DeviceScope() {
    if (entered_ && previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  const int device_;
  int previous_ = 0;
  bool entered_ = false;
};

// Runs body(lane, index, item) for every item, item i on lane i % lanes,
// between a fork from and a join back to `stream`; then after() on `stream`
// (still on `device`), when every item was enqueued without error.
template <class Body, class After>
std::string OnLanes(int device, cudaStream_t stream, int num_lanes, int64_t items, Body body, After after) {
  std::string error = core::CheckLaneCount(num_lanes);
  if (!error.empty()) return error;
  StreamPool* pool = StreamPool::ForDevice(device, &error);
  if (pool == nullptr) return error;
  const int lanes = static_cast<int>(core::LanesUsed(num_lanes, items));
  error = pool->EnsureLanes(lanes);
  if (!error.empty()) return error;
  DeviceScope scope(device);
  error = scope.Enter();
  if (!error.empty()) return error;
  error = pool->Fork(stream, lanes);
  if (!error.empty()) return error;
  std::string first_error;
  for (int64_t item = 0; item < items; ++item) {
    const int lane = static_cast<int>(item % lanes);
    first_error = body(pool->lane(lane), lane, item);
    if (!first_error.empty()) break;
  }
  // Join even after an error, so the op's stream never runs ahead of work
  // already enqueued on the lanes.
  error = pool->Join(stream, lanes);
  if (first_error.empty()) first_error = error;
  return first_error.empty() ? after() : first_error;
}

template <class Body>
std::string OnLanes(int device, cudaStream_t stream, int num_lanes, int64_t items, Body body) {
  return OnLanes(device, stream, num_lanes, items, body, [] { return std::string(); });
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

std::string Conv2DForward(const core::Conv2DShape& s, const float* input, const float* filter,
                          float* output, int num_lanes, float* workspace, cudaStream_t stream,
                          int device) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  return OnLanes(device, stream, num_lanes, s.batch, [&](Lane& lane, int index, int64_t n) -> std::string {
    const float* sample = input + n * s.InputSampleElements();
    const float* col = sample;
    if (!s.IsPointwise()) {
      float* own = workspace + index * col_size;
      Im2ColKernel<<<Blocks(col_size), 256, 0, lane.stream>>>(s, sample, own);
      TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      col = own;
    }
    core::GemmArgs g;
    g.m = s.OutputPixels(), g.n = s.out_c, g.k = s.PatchSize();
    g.a = col, g.lda = s.PatchSize();
    g.b = filter, g.ldb = s.out_c;
    g.c = output + n * s.OutputSampleElements(), g.ldc = s.out_c;
    return LaneGemm(lane, g);
  });
}

std::string Conv2DBackpropInput(const core::Conv2DShape& s, const float* filter,
                                const float* output_grad, float* input_grad, int num_lanes,
                                float* workspace, cudaStream_t stream, int device) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  return OnLanes(device, stream, num_lanes, s.batch, [&](Lane& lane, int index, int64_t n) -> std::string {
    float* sample_grad = input_grad + n * s.InputSampleElements();
    core::GemmArgs g;  // dcol = dy[n] filter^T
    g.transpose_b = true;
    g.m = s.OutputPixels(), g.n = s.PatchSize(), g.k = s.out_c;
    g.a = output_grad + n * s.OutputSampleElements(), g.lda = s.out_c;
    g.b = filter, g.ldb = s.out_c;
    g.ldc = s.PatchSize();
    if (s.IsPointwise()) {
      g.c = sample_grad;
      return LaneGemm(lane, g);
    }
    float* col = workspace + index * col_size;
    g.c = col;
    std::string error = LaneGemm(lane, g);
    if (!error.empty()) return error;
    Col2ImKernel<<<Blocks(s.InputSampleElements()), 256, 0, lane.stream>>>(s, col, sample_grad);
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return "";
  });
}

std::string Conv2DBackpropFilter(const core::Conv2DShape& s, const float* input,
                                 const float* output_grad, float* filter_grad, int num_lanes,
                                 float* workspace, cudaStream_t stream, int device) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  const int64_t groups = core::FilterGradGroups(s);
  float* partials = groups > 1 ? workspace + core::Conv2DForwardWorkspace(s, num_lanes) : filter_grad;
  auto sum_partials = [&]() -> std::string {
    if (groups == 1) return "";
    SumPartialsKernel<<<Blocks(s.FilterElements()), 256, 0, stream>>>(partials, groups, s.FilterElements(),
                                                                       filter_grad);
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return "";
  };
  return OnLanes(device, stream, num_lanes, groups, [&](Lane& lane, int index, int64_t group) -> std::string {
    const int64_t first = core::SplitPoint(s.batch, groups, group);
    const int64_t last = core::SplitPoint(s.batch, groups, group + 1);
    for (int64_t n = first; n < last; ++n) {
      const float* sample = input + n * s.InputSampleElements();
      const float* col = sample;
      if (!s.IsPointwise()) {
        float* own = workspace + index * col_size;
        Im2ColKernel<<<Blocks(col_size), 256, 0, lane.stream>>>(s, sample, own);
        TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        col = own;
      }
      core::GemmArgs g;  // partial (+)= col^T dy[n]
      g.transpose_a = true;
      g.m = s.PatchSize(), g.n = s.out_c, g.k = s.OutputPixels();
      g.a = col, g.lda = s.PatchSize();
      g.b = output_grad + n * s.OutputSampleElements(), g.ldb = s.out_c;
      g.c = partials + group * s.FilterElements(), g.ldc = s.out_c;
      g.accumulate = n > first;
      std::string gemm_error = LaneGemm(lane, g);
      if (!gemm_error.empty()) return gemm_error;
    }
    return "";
  }, sum_partials);
}

std::string ToFloat32(const void* input, core::DType dtype, float* output, int64_t count, cudaStream_t stream,
                      int device) {
  if (count <= 0) return "";
  DeviceScope scope(device);
  std::string error = scope.Enter();
  if (!error.empty()) return error;
  if (dtype == core::DType::kFloat16) {
    WidenKernel<<<Blocks(count), 256, 0, stream>>>(static_cast<const core::Float16*>(input), output, count);
  } else if (dtype == core::DType::kBFloat16) {
    WidenKernel<<<Blocks(count), 256, 0, stream>>>(static_cast<const core::BFloat16*>(input), output, count);
  } else {
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(output, input, sizeof(float) * count, cudaMemcpyDeviceToDevice,
                                                stream));
  }
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return "";
}

std::string FromFloat32(const float* input, core::DType dtype, void* output, int64_t count, cudaStream_t stream,
                        int device) {
  if (count <= 0) return "";
  DeviceScope scope(device);
  std::string error = scope.Enter();
  if (!error.empty()) return error;
  if (dtype == core::DType::kFloat16) {
    NarrowKernel<<<Blocks(count), 256, 0, stream>>>(input, static_cast<core::Float16*>(output), count);
  } else if (dtype == core::DType::kBFloat16) {
    NarrowKernel<<<Blocks(count), 256, 0, stream>>>(input, static_cast<core::BFloat16*>(output), count);
  } else {
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(output, input, sizeof(float) * count, cudaMemcpyDeviceToDevice,
                                                stream));
  }
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return "";
}

std::string MatMul(int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                   bool transpose_b, float* c, int num_lanes, cudaStream_t stream, int device) {
  if (core::NumTiles(m, n) == 0) return core::CheckLaneCount(num_lanes);
  return OnLanes(device, stream, num_lanes, core::NumTiles(m, n), [&](Lane& lane, int, int64_t item) {
    return LaneGemm(lane, core::MatMulTileGemm(n, k, a, b, transpose_b, c, core::TileAt(m, n, item)));
  });
}

std::string MatMulGradWeights(int64_t m, int64_t k, int64_t n, const float* a,
                              const float* output_grad, float* grad_weights, int num_lanes,
                              cudaStream_t stream, int device) {
  if (k <= 0 || n <= 0) return "";
  if (m <= 0) {
    DeviceScope scope(device);
    std::string error = scope.Enter();
    if (!error.empty()) return error;
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grad_weights, 0, sizeof(float) * k * n, stream));
    return "";
  }
  return OnLanes(device, stream, num_lanes, core::NumTiles(k, n), [&](Lane& lane, int, int64_t item) {
    return LaneGemm(lane, core::MatMulGradWeightsTileGemm(m, k, n, a, output_grad, grad_weights,
                                                          core::TileAt(k, n, item)));
  });
}

}  // namespace tf_glp::cuda
