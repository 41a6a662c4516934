#include "cc/core/dtype.h"

namespace tf_glp::core {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

int DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

}  // namespace tf_glp::core
