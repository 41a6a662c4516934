// GPU checks of the CUDA lane pool and the concurrent conv / matmul kernels
// (cc/cuda/stream_pool.h, concurrent_ops.h), built and run by tools/gpu_check.sh with nvcc
// alone (no TensorFlow). Checks behaviour (pool reuse, fork/join ordering,
// results against the CPU core, bitwise equality across lane counts, cuBLAS
// against the built-in GEMM), then prints a timing table. Not part of the op
// library (setup.py compiles cc/cuda/*.cu only) nor of CMake's tests.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cc/core/conv.h"
#include "cc/core/lane_pool.h"
#include "cc/core/matmul.h"
#include "cc/cuda/concurrent_ops.h"
#include "cc/tests/test_main.h"

namespace tf_glp::cuda {
namespace {

#define CHECK_CUDA(call) EXPECT_EQ(std::string(cudaGetErrorString(call)), std::string("no error"))
#define CHECK_OK(expr) EXPECT_EQ(std::string(expr), std::string(""))

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

struct DeviceBuffer {
  float* ptr = nullptr;
  int64_t size = 0;
  explicit DeviceBuffer(int64_t n) : size(std::max<int64_t>(n, 1)) { cudaMalloc(&ptr, sizeof(float) * size); }
  DeviceBuffer(const std::vector<float>& host) : DeviceBuffer(static_cast<int64_t>(host.size())) {
    cudaMemcpy(ptr, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice);
    // From pageable memory cudaMemcpy may return before the copy lands; the
    // lanes are non-blocking streams that would not wait for it.
    cudaDeviceSynchronize();
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<float> Get(int64_t n) const {
    std::vector<float> host(n);
    cudaMemcpy(host.data(), ptr, sizeof(float) * n, cudaMemcpyDeviceToHost);
    return host;
  }
};

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rtol) {
  float scale = 1.0f;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= rtol * scale)) {
      throw testing::Failure("element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " +
                             std::to_string(want[i]));
    }
  }
}

TEST(PoolIsPerDeviceLazyAndReused) {
  std::string error;
  StreamPool* pool = StreamPool::ForDevice(0, &error);
  EXPECT_TRUE(pool != nullptr);
  EXPECT_TRUE(StreamPool::ForDevice(0, &error) == pool);
  CHECK_OK(pool->EnsureLanes(4));
  EXPECT_TRUE(pool->created_lanes() >= 4);
  const cudaStream_t first = pool->lane(0).stream;
  CHECK_OK(pool->EnsureLanes(2));  // never shrinks or recreates
  EXPECT_TRUE(pool->lane(0).stream == first);
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) EXPECT_TRUE(pool->lane(i).stream != pool->lane(j).stream);
  }
  EXPECT_TRUE(StreamPool::ForDevice(1 << 20, &error) == nullptr);
  EXPECT_TRUE(error.find("no CUDA device") != std::string::npos);
}

__global__ void SlowWrite(float* flag, float value) {
  const long long start = clock64();
  while (clock64() - start < 50000000) {
  }
  *flag = value;
}

__global__ void CopyFlag(const float* flag, float* out, int index) { out[index] = *flag; }

__global__ void CopyValues(const float* from, float* to, int count) {
  for (int i = 0; i < count; ++i) to[i] = from[i];
}

// Each half would pass without the fork or without the join if the lanes or
// the parent were kept busy first: the reads happen at once, so only the
// events can order them after the slow writes.
TEST(ForkAndJoinKeepStreamOrder) {
  std::string error;
  StreamPool* pool = StreamPool::ForDevice(0, &error);
  CHECK_OK(pool->EnsureLanes(8));
  cudaStream_t parent;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parent, cudaStreamNonBlocking));
  DeviceBuffer flag(1), seen(8), done(8), after(8);
  CHECK_CUDA(cudaMemset(flag.ptr, 0, sizeof(float)));
  CHECK_CUDA(cudaMemset(done.ptr, 0, 8 * sizeof(float)));
  CHECK_CUDA(cudaDeviceSynchronize());  // the memsets ran on the legacy stream
  SlowWrite<<<1, 1, 0, parent>>>(flag.ptr, 1.0f);
  CHECK_OK(pool->Fork(parent, 8));
  for (int i = 0; i < 8; ++i) {
    CopyFlag<<<1, 1, 0, pool->lane(i).stream>>>(flag.ptr, seen.ptr, i);  // fork: reads 1, never 0
    SlowWrite<<<1, 1, 0, pool->lane(i).stream>>>(done.ptr + i, 1.0f);
  }
  CHECK_OK(pool->Join(parent, 8));
  CopyValues<<<1, 1, 0, parent>>>(done.ptr, after.ptr, 8);  // join: reads 1s, never 0s
  CHECK_CUDA(cudaStreamSynchronize(parent));
  for (float v : seen.Get(8)) EXPECT_EQ(v, 1.0f);
  for (float v : after.Get(8)) EXPECT_EQ(v, 1.0f);
  cudaStreamDestroy(parent);
}

struct ConvResults {
  std::vector<float> y, dx, dw;
};

ConvResults RunGpuConv(const core::Conv2DShape& s, const std::vector<float>& x, const std::vector<float>& w,
                       const std::vector<float>& dy, int lanes) {
  DeviceBuffer dx_in(x), dw_in(w), ddy(dy);
  DeviceBuffer y(s.batch * s.OutputSampleElements()), dx(x.size()), dw(w.size());
  const int64_t ws = std::max({core::Conv2DForwardWorkspace(s, lanes), core::Conv2DBackpropInputWorkspace(s, lanes),
                               core::Conv2DBackpropFilterWorkspace(s, lanes)});
  DeviceBuffer workspace(ws);
  CHECK_OK(Conv2DForward(s, dx_in.ptr, dw_in.ptr, y.ptr, lanes, workspace.ptr, nullptr, 0));
  CHECK_OK(Conv2DBackpropInput(s, dw_in.ptr, ddy.ptr, dx.ptr, lanes, workspace.ptr, nullptr, 0));
  CHECK_OK(Conv2DBackpropFilter(s, dx_in.ptr, ddy.ptr, dw.ptr, lanes, workspace.ptr, nullptr, 0));
  CHECK_CUDA(cudaDeviceSynchronize());
  return {y.Get(s.batch * s.OutputSampleElements()), dx.Get(x.size()), dw.Get(w.size())};
}

void CheckConvShape(core::Conv2DShape s, bool same, uint32_t seed) {
  EXPECT_EQ(core::MakeConv2DShape(same, &s), std::string(""));
  auto x = Random(s.batch * s.InputSampleElements(), seed);
  auto w = Random(s.FilterElements(), seed + 1);
  auto dy = Random(s.batch * s.OutputSampleElements(), seed + 2);
  // CPU core reference.
  const core::CpuLanePool& cpu = core::CpuLanePool::Global();
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
  std::vector<float> ws(std::max({core::Conv2DForwardWorkspace(s, 1), core::Conv2DBackpropFilterWorkspace(s, 1), int64_t{1}}));
  core::Conv2DForward(s, x.data(), w.data(), y.data(), 1, ws.data(), cpu);
  core::Conv2DBackpropInput(s, w.data(), dy.data(), dx.data(), 1, ws.data(), cpu);
  core::Conv2DBackpropFilter(s, x.data(), dy.data(), dw.data(), 1, ws.data(), cpu);
  ConvResults first = RunGpuConv(s, x, w, dy, 1);
  ExpectClose(first.y, y, 1e-5f);
  ExpectClose(first.dx, dx, 1e-4f);
  ExpectClose(first.dw, dw, 1e-4f);
  for (int lanes : {2, 3, 8, 1}) {
    ConvResults again = RunGpuConv(s, x, w, dy, lanes);
    EXPECT_TRUE(std::memcmp(again.y.data(), first.y.data(), 4 * y.size()) == 0);
    EXPECT_TRUE(std::memcmp(again.dx.data(), first.dx.data(), 4 * dx.size()) == 0);
    EXPECT_TRUE(std::memcmp(again.dw.data(), first.dw.data(), 4 * dw.size()) == 0);
  }
}

TEST(ConvMatchesCpuAndIsBitwiseTheSameForEveryLaneCount) {
  core::Conv2DShape s;
  s.batch = 7, s.in_h = 13, s.in_w = 11, s.in_c = 3, s.filter_h = 3, s.filter_w = 3, s.out_c = 8;
  CheckConvShape(s, true, 1);
  CheckConvShape(s, false, 2);
  s.stride_h = 2, s.stride_w = 2;
  CheckConvShape(s, true, 3);
  s.stride_h = 1, s.stride_w = 1, s.dilation_h = 2, s.dilation_w = 3;
  CheckConvShape(s, true, 4);
  s.dilation_h = 1, s.dilation_w = 1, s.filter_h = 1, s.filter_w = 1;  // pointwise
  CheckConvShape(s, false, 5);
  s.batch = 40, s.filter_h = 5, s.filter_w = 5;  // more samples than groups
  CheckConvShape(s, true, 6);
}

TEST(MatMulMatchesCpuAndIsBitwiseTheSameForEveryLaneCount) {
  const int64_t m = 300, k = 70, n = 290;  // 3 x 2 tiles (Note [Work plan])
  auto a = Random(m * k, 1), w = Random(k * n, 2), dy = Random(m * n, 3);
  const core::CpuLanePool& cpu = core::CpuLanePool::Global();
  std::vector<float> y(m * n), dx(m * k), dw(k * n);
  core::ConcurrentMatMul(m, n, k, a.data(), w.data(), false, y.data(), 1, cpu);
  core::ConcurrentMatMul(m, k, n, dy.data(), w.data(), true, dx.data(), 1, cpu);
  core::MatMulGradWeights(m, k, n, a.data(), dy.data(), dw.data(), 1, cpu);
  DeviceBuffer da(a), dwt(w), ddy(dy), gy(m * n), gdx(m * k), gdw(k * n);
  std::vector<float> first;
  for (int lanes : {1, 2, 4, 8}) {
    CHECK_OK(MatMul(m, n, k, da.ptr, dwt.ptr, false, gy.ptr, lanes, nullptr, 0));
    CHECK_OK(MatMul(m, k, n, ddy.ptr, dwt.ptr, true, gdx.ptr, lanes, nullptr, 0));
    CHECK_OK(MatMulGradWeights(m, k, n, da.ptr, ddy.ptr, gdw.ptr, lanes, nullptr, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> all = gy.Get(m * n), part = gdx.Get(m * k), part2 = gdw.Get(k * n);
    ExpectClose(all, y, 1e-5f);
    ExpectClose(part, dx, 1e-4f);
    ExpectClose(part2, dw, 1e-4f);
    all.insert(all.end(), part.begin(), part.end());
    all.insert(all.end(), part2.begin(), part2.end());
    if (first.empty()) first = all;
    EXPECT_TRUE(std::memcmp(all.data(), first.data(), 4 * all.size()) == 0);
  }
}

// The built-in kernel on lane 0 against the CPU reference, bit for bit.
void CheckBuiltinGemm(StreamPool* pool, core::GemmArgs g, uint32_t seed) {
  auto a = Random(g.m * g.k, seed), b = Random(g.k * g.n, seed + 9), c = Random(g.m * g.n, seed + 19);
  std::vector<float> want = c;
  core::GemmArgs host = g;
  host.a = a.data(), host.b = b.data(), host.c = want.data();
  core::ReferenceGemm(host, /*fused_multiply_add=*/true);
  DeviceBuffer da(a), db(b), dc(c);
  g.a = da.ptr, g.b = db.ptr, g.c = dc.ptr;
  CHECK_OK(LaneGemm(pool->lane(0), g, /*force_builtin=*/true));
  CHECK_CUDA(cudaStreamSynchronize(pool->lane(0).stream));
  std::vector<float> got = dc.Get(g.m * g.n);
  EXPECT_TRUE(std::memcmp(got.data(), want.data(), 4 * got.size()) == 0);
}

TEST(BuiltInGemmMatchesCpuGemmBitForBit) {
  // The built-in kernel sums in order with FMA, like the CPU GEMM's FMA paths.
  std::string error;
  StreamPool* pool = StreamPool::ForDevice(0, &error);
  CHECK_OK(error);
  CHECK_OK(pool->EnsureLanes(1));
  for (int trial = 0; trial < 8; ++trial) {
    core::GemmArgs g;
    g.transpose_a = trial & 1, g.transpose_b = trial & 2, g.accumulate = trial & 4;
    g.m = 37 + trial, g.n = 29, g.k = 101;
    g.lda = g.transpose_a ? g.m : g.k, g.ldb = g.transpose_b ? g.k : g.n, g.ldc = g.n;
    CheckBuiltinGemm(pool, g, trial);
  }
  // 70000 row tiles of 16: more than grid.y's 65535, so the kernel loops.
  core::GemmArgs tall;
  tall.m = 70000 * 16, tall.n = 3, tall.k = 2, tall.lda = 2, tall.ldb = 3, tall.ldc = 3;
  CheckBuiltinGemm(pool, tall, 5);
}

// Note [16-bit layers]: the device conversions round exactly as the core's
// scalar reference (cc/core/dtype.h), including subnormals, inf and NaN.
TEST(SixteenBitConversionsMatchTheCore) {
  std::vector<float> values = Random(4096, 11);
  for (float special : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, 6e-5f, 3.0e38f, INFINITY, -INFINITY, NAN}) {
    values.push_back(special);
  }
  DeviceBuffer wide(values), back(values.size());
  void* narrow = nullptr;
  CHECK_CUDA(cudaMalloc(&narrow, 2 * values.size()));
  const int64_t n = static_cast<int64_t>(values.size());
  for (core::DType dtype : {core::DType::kFloat16, core::DType::kBFloat16}) {
    CHECK_OK(FromFloat32(wide.ptr, dtype, narrow, n, nullptr, 0));
    CHECK_OK(ToFloat32(narrow, dtype, back.ptr, n, nullptr, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> got = back.Get(n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = dtype == core::DType::kFloat16 ? core::ToFloat(core::ToFloat16(values[i]))
                                                         : core::ToFloat(core::ToBFloat16(values[i]));
      EXPECT_TRUE(std::memcmp(&got[i], &want, 4) == 0);
    }
  }
  cudaFree(narrow);
}

// What the start-up profiler's occupancy model reads from the op library.
TEST(Im2ColLaunchResourcesAreReadable) {
  int threads = 0, registers = 0, shared = -1;
  EXPECT_TRUE(tf_glp_im2col_launch(&threads, &registers, &shared) == 0);
  EXPECT_TRUE(threads == 256);
  EXPECT_TRUE(registers > 0 && registers <= 255);
  EXPECT_TRUE(shared == 0);
  std::printf("  im2col kernel: %d threads a block, %d registers a thread, %d bytes of shared memory\n", threads,
              registers, shared);
}

TEST(BadLaneCountIsAnError) {
  core::Conv2DShape s;
  s.batch = 1, s.in_h = 4, s.in_w = 4, s.in_c = 1, s.filter_h = 3, s.filter_w = 3, s.out_c = 1;
  core::MakeConv2DShape(true, &s);
  EXPECT_TRUE(Conv2DForward(s, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0).find("got 0") != std::string::npos);
  EXPECT_TRUE(MatMul(1, 1, 1, nullptr, nullptr, false, nullptr, 65, nullptr, 0).find("got 65") != std::string::npos);
}

// Forward + both gradients of one layer, per lane count: milliseconds.
// Prints the table; returns 1 (after naming the case) if a step fails.
int TimingTable() {
  struct Case {
    const char* name;
    int64_t batch, h, w, c, k, out, stride;
  };
  const Case cases[] = {
      {"LeNet conv1 28x28x1 -> 6 5x5", 32, 28, 28, 1, 5, 6, 1},
      {"LeNet conv2 14x14x6 -> 16 5x5", 32, 14, 14, 6, 5, 16, 1},
      {"CIFAR conv 32x32x3 -> 32 3x3", 32, 32, 32, 3, 3, 32, 1},
      {"CIFAR conv 16x16x32 -> 64 3x3", 32, 16, 16, 32, 3, 64, 1},
      {"CIFAR conv 8x8x64 -> 128 3x3", 8, 8, 8, 64, 3, 128, 1},
      {"large: 56x56x64 -> 64 3x3 b128", 128, 56, 56, 64, 3, 64, 1},
  };
  std::string blas;
  CublasAvailable(&blas);
  std::printf("\nGEMM: %s. Forward + input grad + filter grad, ms per step (median of 10):\n", blas.c_str());
  std::printf("%-34s %9s %9s %9s %9s %8s\n", "layer (batch)", "k=1", "k=2", "k=4", "k=8", "best/k1");
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (const Case& c : cases) {
    core::Conv2DShape s;
    s.batch = c.batch, s.in_h = c.h, s.in_w = c.w, s.in_c = c.c, s.filter_h = c.k, s.filter_w = c.k, s.out_c = c.out;
    s.stride_h = s.stride_w = c.stride;
    core::MakeConv2DShape(true, &s);
    DeviceBuffer x(Random(s.batch * s.InputSampleElements(), 1)), w(Random(s.FilterElements(), 2));
    DeviceBuffer dy(Random(s.batch * s.OutputSampleElements(), 3));
    DeviceBuffer y(s.batch * s.OutputSampleElements()), dx(s.batch * s.InputSampleElements()), dw(s.FilterElements());
    DeviceBuffer ws(std::max({core::Conv2DForwardWorkspace(s, 8), core::Conv2DBackpropFilterWorkspace(s, 8)}));
    double ms[4];
    int column = 0;
    for (int lanes : {1, 2, 4, 8}) {
      std::vector<float> samples;
      for (int rep = 0; rep < 12; ++rep) {
        cudaEventRecord(start, stream);
        std::string error = Conv2DForward(s, x.ptr, w.ptr, y.ptr, lanes, ws.ptr, stream, 0);
        if (error.empty()) error = Conv2DBackpropInput(s, w.ptr, dy.ptr, dx.ptr, lanes, ws.ptr, stream, 0);
        if (error.empty()) error = Conv2DBackpropFilter(s, x.ptr, dy.ptr, dw.ptr, lanes, ws.ptr, stream, 0);
        cudaEventRecord(stop, stream);
        const cudaError_t status = cudaEventSynchronize(stop);
        if (error.empty() && status != cudaSuccess) error = cudaGetErrorString(status);
        if (!error.empty()) {  // a time of a failed step would mean nothing
          std::printf("%-34s FAILED at k=%d: %s\n", c.name, lanes, error.c_str());
          return 1;
        }
        float elapsed = 0;
        cudaEventElapsedTime(&elapsed, start, stop);
        if (rep >= 2) samples.push_back(elapsed);
      }
      std::sort(samples.begin(), samples.end());
      ms[column++] = samples[samples.size() / 2];
    }
    const double best = std::min({ms[0], ms[1], ms[2], ms[3]});
    char label[64];
    std::snprintf(label, sizeof(label), "%s (%lld)", c.name, static_cast<long long>(c.batch));
    std::printf("%-34s %9.3f %9.3f %9.3f %9.3f %7.2fx\n", label, ms[0], ms[1], ms[2], ms[3], ms[0] / best);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace tf_glp::cuda

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::string gemm;
  tf_glp::cuda::CublasAvailable(&gemm);
  std::printf("device 0: %s (sm_%d%d), driver CUDA %d.%d, runtime CUDA %d.%d, GEMM: %s\n", prop.name, prop.major,
              prop.minor, driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10, gemm.c_str());
  const int failed = tf_glp::testing::RunAllTests();
  int timing_failed = 0;
  if (argc < 2 || std::strcmp(argv[1], "--no-timing") != 0) timing_failed = tf_glp::cuda::TimingTable();
  return failed + timing_failed;
}
