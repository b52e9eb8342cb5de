#include "util/dtype.h"

#include "util/error.h"

namespace g4 {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::Q8_0: return "Q8_0";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

size_t row_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::F32:
    case DType::I32: return size_t(cols) * 4;
    case DType::F16:
    case DType::BF16: return size_t(cols) * 2;
    case DType::I64: return size_t(cols) * 8;
    case DType::Q8_0:
      G4_CHECK(cols % kQ8BlockSize == 0, "Q8_0 rows need a multiple of 32 elements, got " + std::to_string(cols));
      return size_t(cols / kQ8BlockSize) * kQ8BlockBytes;
  }
  return 0;
}

}  // namespace g4
