// The layer-concurrency ops on the GPU. See concurrent_ops.h.
#include "cc/cuda/concurrent_ops.h"

#include <algorithm>
#include <string>

namespace tf_glp::cuda {
namespace {

constexpr int kIm2ColThreads = 256;

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

// Sample n's patch matrix, made on `lane`: the sample itself for a pointwise
// convolution, else its im2col into the lane's slice of the workspace.
std::string PatchMatrix(const core::Conv2DShape& s, const float* input, int64_t n, Lane& lane, float* lane_workspace,
                        const float** col) {
  const float* sample = input + n * s.InputSampleElements();
  *col = sample;
  if (s.IsPointwise()) return "";
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  Im2ColKernel<<<Blocks(col_size), kIm2ColThreads, 0, lane.stream>>>(s, sample, lane_workspace);
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  *col = lane_workspace;
  return "";
}

}  // namespace

std::string Conv2DForward(const core::Conv2DShape& s, const float* input, const float* filter,
                          float* output, int num_lanes, float* workspace, cudaStream_t stream,
                          int device) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  return OnLanes(device, stream, num_lanes, s.batch, [&](Lane& lane, int index, int64_t n) -> std::string {
    const float* col = nullptr;
    std::string error = PatchMatrix(s, input, n, lane, workspace + index * col_size, &col);
    if (!error.empty()) return error;
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
      const float* col = nullptr;
      std::string error = PatchMatrix(s, input, n, lane, workspace + index * col_size, &col);
      if (!error.empty()) return error;
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

namespace {

// float32 <-> 16 bits on `stream` (Note [16-bit layers]); one side is float32
// (float32 to float32 is a copy).
std::string Convert(const void* input, core::DType from, void* output, core::DType to, int64_t count,
                    cudaStream_t stream, int device) {
  if (count <= 0) return "";
  DeviceScope scope(device);
  std::string error = scope.Enter();
  if (!error.empty()) return error;
  const int blocks = Blocks(count);
  if (from == to) {
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(output, input, core::DTypeSize(from) * count,
                                                cudaMemcpyDeviceToDevice, stream));
  } else if (from == core::DType::kFloat16) {
    WidenKernel<<<blocks, 256, 0, stream>>>(static_cast<const core::Float16*>(input), static_cast<float*>(output),
                                            count);
  } else if (from == core::DType::kBFloat16) {
    WidenKernel<<<blocks, 256, 0, stream>>>(static_cast<const core::BFloat16*>(input), static_cast<float*>(output),
                                            count);
  } else if (to == core::DType::kFloat16) {
    NarrowKernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(input), static_cast<core::Float16*>(output),
                                             count);
  } else {
    NarrowKernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(input), static_cast<core::BFloat16*>(output),
                                             count);
  }
  TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return "";
}

}  // namespace

std::string ToFloat32(const void* input, core::DType dtype, float* output, int64_t count, cudaStream_t stream,
                      int device) {
  return Convert(input, dtype, output, core::DType::kFloat32, count, stream, device);
}

std::string FromFloat32(const float* input, core::DType dtype, void* output, int64_t count, cudaStream_t stream,
                        int device) {
  return Convert(input, core::DType::kFloat32, output, dtype, count, stream, device);
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

extern "C" int tf_glp_im2col_launch(int* threads_per_block, int* registers_per_thread,
                                    int* shared_bytes_per_block) {
  cudaFuncAttributes attributes;
  const cudaError_t status = cudaFuncGetAttributes(&attributes, tf_glp::cuda::Im2ColKernel);
  if (status != cudaSuccess) return static_cast<int>(status);
  *threads_per_block = tf_glp::cuda::kIm2ColThreads;
  *registers_per_thread = attributes.numRegs;
  *shared_bytes_per_block = static_cast<int>(attributes.sharedSizeBytes);
  return 0;
}
