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
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q5_1: return "Q5_1";
    case DType::Q4_K: return "Q4_K";
    case DType::Q5_K: return "Q5_K";
    case DType::Q6_K: return "Q6_K";
    case DType::TQ4: return "TQ4";
  }
  return "?";
}

int64_t block_size(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1: return 32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return kQkBlockSize;
    default: return 1;
  }
}

size_t block_bytes(DType t) {
  // ggml's block structs (ggml-common.h), all packed without padding.
  switch (t) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::Q8_0: return 2 + 32;           // d, qs[32]
    case DType::Q4_0: return 2 + 16;           // d, qs[16]
    case DType::Q4_1: return 2 + 2 + 16;       // d, m, qs[16]
    case DType::Q5_0: return 2 + 4 + 16;       // d, qh[4], qs[16]
    case DType::Q5_1: return 2 + 2 + 4 + 16;   // d, m, qh[4], qs[16]
    case DType::Q4_K: return 2 + 2 + 12 + 128;           // d, dmin, scales[12], qs[128]
    case DType::Q5_K: return 2 + 2 + 12 + 32 + 128;      // d, dmin, scales[12], qh[32], qs[128]
    case DType::Q6_K: return 128 + 64 + 16 + 2;          // ql[128], qh[64], scales[16], d
    case DType::TQ4: return 1;                            // elements are bytes
  }
  return 0;
}

size_t row_bytes(DType t, int64_t cols) {
  const int64_t block = block_size(t);
  G4_CHECK(cols % block == 0, dtype_name(t) + " rows need a multiple of " + std::to_string(block) +
                                  " elements, got " + std::to_string(cols));
  return size_t(cols / block) * block_bytes(t);
}

}  // namespace g4
