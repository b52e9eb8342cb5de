// The tile-interleaved Q4_0 records of docs/DESIGN.md §7 (backend/cuda/q4_0_records.h), on the CPU:
// every quant of a record has one place, that place is the mma fragment slot the layout promises
// (a lane's values of a block are 8 consecutive ones), the staged tokens meet their weights, and packing a GGUF matrix keeps every quant
// and scale, so the records hold exactly the weights the GGUF codec decodes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/q4_0_records.h"
#include "quant/block_formats.h"
#include "util/half.h"

namespace g4 {
namespace {

using namespace records;

TEST(Q4_0Records, EveryQuantHasItsFragmentSlot) {
  std::set<int> taken;
  for (int row = 0; row < kTileRows; ++row) {
    for (int k = 0; k < kValues; ++k) {
      const Place p = place_of(row, k);
      ASSERT_TRUE(p.lane >= 0 && p.lane < 32 && p.word >= 0 && p.word < 4 && p.shift % 4 == 0 && p.shift < 32);
      EXPECT_TRUE(taken.insert(p.lane * 32 + p.word * 8 + p.shift / 4).second) << "row " << row << ", k " << k;
      // Register j = (shift % 16) / 4 of k-step `word`: row g (j even) or g + 8, fragment slot 2c + e
      // (j < 2) or 2c + 8 + e, e = the half; lane c's values of block b are 8c .. 8c + 7.
      const int g = p.lane / 4, c = p.lane % 4, j = (p.shift % 16) / 4, e = p.shift / 16;
      EXPECT_EQ(row, g + 8 * (j % 2));
      EXPECT_EQ(k, 32 * (p.word / 2) + 8 * c + 4 * (p.word % 2) + 2 * (j / 2) + e);
    }
  }
  EXPECT_EQ(taken.size(), size_t(kQuantBytes * 2));  // every nibble of the 512 quant bytes
}

// The tokens staged for wgmma (staged_column) sit where the weights they multiply sit: value k of
// the record at B's position 16 · (k-step) + (fragment slot) of its weight.
TEST(Q4_0Records, StagedActivationsMeetTheirWeights) {
  std::set<int> columns;
  for (int k = 0; k < kValues; ++k) {
    const Place p = place_of(0, k);
    const int c = p.lane % 4, j = (p.shift % 16) / 4, e = p.shift / 16;
    const int column = staged_column(k / 2) + k % 2;
    EXPECT_EQ(column, 16 * p.word + 2 * c + 8 * (j / 2) + e) << "k " << k;
    columns.insert(column);
  }
  EXPECT_EQ(columns.size(), size_t(kValues));
}

TEST(Q4_0Records, PackingKeepsEveryWeightOfTheGgufMatrix) {
  constexpr int64_t N = 32, K = 192;
  std::mt19937 rng(5);
  std::vector<uint8_t> gguf(size_t(N * K / 32) * kGgufBlockBytes);
  for (uint8_t& b : gguf) b = uint8_t(rng());
  for (size_t at = 0; at < gguf.size(); at += kGgufBlockBytes) gguf[at + 1] &= 0x3b;  // a finite fp16 scale
  std::vector<uint8_t> packed(matrix_bytes(N, K), 0xAB);
  ASSERT_EQ(packed.size(), size_t(2 * 3 * kBytes));
  for (int64_t tile = 0; tile < N / kTileRows; ++tile)
    for (int64_t chunk = 0; chunk < K / kValues; ++chunk)
      pack_q4_0_record(gguf.data(), K, tile, chunk, packed.data() + record_offset(K, tile, chunk));
  const BlockCodec* codec = block_codec(DType::Q4_0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t block = 0; block < K / 32; ++block) {
      const uint8_t* gguf_block = gguf.data() + size_t(n * (K / 32) + block) * kGgufBlockBytes;
      float decoded[32];
      codec->decode(gguf_block, decoded);
      for (int i = 0; i < 32; ++i) {
        const int64_t k = 32 * block + i;
        const uint8_t* record = packed.data() + record_offset(K, n / kTileRows, k / kValues);
        const int row = int(n % kTileRows), kk = int(k % kValues);
        const int q = quant_at(record, row, kk);
        EXPECT_EQ(q, i < 16 ? gguf_block[2 + i] & 15 : gguf_block[2 + i - 16] >> 4) << n << ", " << k;
        uint16_t d;
        std::memcpy(&d, gguf_block, 2);
        EXPECT_EQ(scale_bits_at(record, row, kk), d);
        EXPECT_EQ(float(q - 8) * f16_to_f32(scale_bits_at(record, row, kk)), decoded[i]) << n << ", " << k;
      }
    }
  }
}

}  // namespace
}  // namespace g4
