// A single-threaded, cache-blocked float32 GEMM for the layer-concurrency
// ops (cc/core/conv.h): C (+)= op(A) * op(B), row-major.
//
// Why our own GEMM and not Eigen's: the core is built without TensorFlow's
// headers (also by tools/gpu_check.sh on machines without TensorFlow), and
// the concurrent ops need a GEMM whose result for one element does not depend
// on how the work was split (Note [GEMM determinism]); with our own kernel
// that is a property of the code, not of a library's blocking heuristics.
//
// Note [GEMM determinism]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every element C[i][j] is computed as the in-order sum
//     c = (accumulate ? C[i][j] : 0);  for p = 0..k-1: c = c + A(i,p) * B(p,j)
// with one rounding per step on the FMA paths (AVX2+FMA, AVX-512: fused
// multiply-add) and two (multiply, then add) on the portable path. Blocking
// over k stores the running sum to C in float32 and reloads it, which does
// not change the result. So the bits of C[i][j] depend only on row i of
// op(A), column j of op(B), the initial C[i][j] and the instruction set; not
// on m, n, the tile it falls in, the thread or the lane running it. The
// concurrent ops rely on this for results that are bitwise identical for
// every number of lanes. (Bits may differ between CPUs with and without FMA,
// as TensorFlow's own kernels do.)
#ifndef TF_GLP_CC_CORE_GEMM_H_
#define TF_GLP_CC_CORE_GEMM_H_

#include <cstdint>

namespace tf_glp::core {

struct GemmArgs {
  // op(A) is m x k: A is stored m x k (lda >= k), or k x m when transpose_a
  // (lda >= m). op(B) is k x n: B is stored k x n (ldb >= n), or n x k when
  // transpose_b (ldb >= k). C is m x n (ldc >= n).
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  // False: C = op(A) op(B). True: C += op(A) op(B).
  bool accumulate = false;
};

// Runs on the calling thread (it allocates thread-local packing buffers once
// per thread). See Note [GEMM determinism].
void Gemm(const GemmArgs& args);

// The instruction set Gemm uses ("avx512", "avx2" or "portable") and whether
// it multiplies and adds with one rounding (FMA).
const char* GemmIsaName();
bool GemmUsesFma();

// The reference Gemm must match bit for bit: the plain in-order loop of
// Note [GEMM determinism], with FMA or not as GemmUsesFma() says. For tests.
void ReferenceGemm(const GemmArgs& args, bool fused_multiply_add);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_GEMM_H_
