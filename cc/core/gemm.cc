// GEMM dispatch (AVX-512 / AVX2 with FMA, else a portable kernel over GCC's
// generic vectors), by the core's one ISA switch (cpu_features.h), and the
// bit-exact reference. See cc/core/gemm.h.
#include "cc/core/gemm.h"

#include "cc/core/cpu_features.h"

#include <cmath>
#include <cstdint>
#include <new>

namespace tf_glp::core {

namespace gemm_portable {
namespace {
// Four floats in GCC's generic vector type: SSE on x86-64, NEON on Arm.
// No FMA: with -ffp-contract=off `a * b + c` rounds twice.
struct VecOps {
  typedef float F __attribute__((vector_size(16)));
  static constexpr int kLanes = 4;
  static F Load(const float* p) {
    F x;
    __builtin_memcpy(&x, p, sizeof(x));
    return x;
  }
  static void Store(float* p, F x) { __builtin_memcpy(p, &x, sizeof(x)); }
  static F Zero() { return F{0.0f, 0.0f, 0.0f, 0.0f}; }
  static F Set1(float x) { return F{x, x, x, x}; }
  static F MulAdd(F a, F b, F c) { return a * b + c; }
};
constexpr int kMr = 4;
constexpr int kNr = 8;
}  // namespace
#include "cc/core/gemm_impl.inc"
}  // namespace gemm_portable

#if defined(__x86_64__)
namespace gemm_avx2 {
void GemmKernel(const GemmArgs& g);
}
namespace gemm_avx512 {
void GemmKernel(const GemmArgs& g);
}
#endif

namespace {

enum class GemmPath { kPortable, kAvx2, kAvx512 };

// The one instruction-set switch of the native core (cpu_features.h): the
// host kernels and the GEMM follow ActiveIsa(), so TF_GLP_ISA moves both and
// native_available() reports the one in use.
GemmPath ChoosePath() {
#if defined(__x86_64__)
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return GemmPath::kAvx512;
    case Isa::kAvx2:
      return GemmPath::kAvx2;
    default:
      break;
  }
#endif
  return GemmPath::kPortable;
}

GemmPath ActivePath() {
  static const GemmPath path = ChoosePath();
  return path;
}

}  // namespace

void Gemm(const GemmArgs& args) {
  switch (ActivePath()) {
#if defined(__x86_64__)
    case GemmPath::kAvx512:
      gemm_avx512::GemmKernel(args);
      return;
    case GemmPath::kAvx2:
      gemm_avx2::GemmKernel(args);
      return;
#endif
    default:
      gemm_portable::GemmKernel(args);
  }
}

const char* GemmIsaName() {
  switch (ActivePath()) {
    case GemmPath::kAvx512:
      return "avx512";
    case GemmPath::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

bool GemmUsesFma() { return ActivePath() != GemmPath::kPortable; }

void ReferenceGemm(const GemmArgs& g, bool fused_multiply_add) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      float c = g.accumulate ? g.c[i * g.ldc + j] : 0.0f;
      for (int64_t p = 0; p < g.k; ++p) {
        const float a = g.transpose_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
        const float b = g.transpose_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        if (fused_multiply_add) {
          c = std::fma(a, b, c);
        } else {
          const float product = a * b;
          c = c + product;
        }
      }
      g.c[i * g.ldc + j] = c;
    }
  }
}

}  // namespace tf_glp::core
