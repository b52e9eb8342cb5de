#include "quant/block_formats.h"

#include "quant/block_common.h"

namespace g4 {

const BlockCodec* block_codec(DType t) {
  switch (t) {
    case DType::Q8_0: return &quant::kQ8_0Codec;
    case DType::Q4_0: return &quant::kQ4_0Codec;
    case DType::Q4_1: return &quant::kQ4_1Codec;
    case DType::Q5_0: return &quant::kQ5_0Codec;
    case DType::Q5_1: return &quant::kQ5_1Codec;
    case DType::Q4_K: return &quant::kQ4_KCodec;
    case DType::Q5_K: return &quant::kQ5_KCodec;
    case DType::Q6_K: return &quant::kQ6_KCodec;
    default: return nullptr;
  }
}

}  // namespace g4
