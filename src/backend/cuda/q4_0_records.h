// Q4_0 weights in tile-interleaved records, the layout of docs/DESIGN.md §7's one arithmetic for
// 1 to 64 tokens: the CUDA backend rearranges Q4_0 weights into it when batch invariance is asked
// for (q4_0_records.cu has the kernels). For each
// 16-row tile and each 64 values of K, one 576-byte record: 32 lanes × 16 bytes of quants, lane
// l's 16 bytes exactly its mma.m16n8k16 A-fragment nibbles for the record's four k16 steps (so a
// lane loads its weights with one 16-byte load and no shuffles), then the 16 rows' two fp16
// scales. K is permuted within each block of 32 so that lane c's fragment slots of a block hold
// its values 8c..8c+7: the lane's activations of a block are one 16-byte load too. Written once
// for host and device (no CUDA header); tests/test_q4_0_records.cpp checks it against the GGUF
// codec on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>

#include "util/host_device.h"

namespace g4::records {

inline constexpr int kTileRows = 16;                            // rows of a record
inline constexpr int kValues = 64;                              // values of K of a record: two Q4_0 blocks
inline constexpr int kQuantBytes = 32 * 16;                     // 32 lanes × 16 bytes
inline constexpr int kBytes = kQuantBytes + kTileRows * 2 * 2;  // then two fp16 scales a row: 576
inline constexpr int kGgufBlockBytes = 18;                      // Q4_0 in GGUF: fp16 d, 16 bytes of nibbles

// Where the quant of (row, k) of a record sits: bits [shift, shift + 4) of 32-bit word `word` of lane
// `lane`'s 16 bytes. Lane l = 4g + c holds the A fragments of rows g and g + 8 (register j = 0: row g
// at fragment slots 2c, 2c + 1; 1: row g + 8; 2: row g at slots 2c + 8, 2c + 9; 3: row g + 8), word s
// its four registers of k-step s at bits 4j (even slot) and 16 + 4j (odd slot). Block b (values 32b
// .. 32b + 31) is k-steps 2b and 2b + 1; its values 8c .. 8c + 3 fill lane c's slots of step 2b in
// the order 2c, 2c + 1, 2c + 8, 2c + 9, its values 8c + 4 .. 8c + 7 those of step 2b + 1.
struct Place {
  int lane, word, shift;
};
G4_HOST_DEVICE constexpr Place place_of(int row_in_tile, int k_in_record) {
  const int b = k_in_record / 32, c = (k_in_record % 32) / 8, v = k_in_record % 8;
  const int g = row_in_tile % 8, j = row_in_tile / 8 + 2 * ((v % 4) / 2);
  return {4 * g + c, 2 * b + v / 4, 4 * j + 16 * (v % 2)};
}

// Where pair `pair` (values 2 pair, 2 pair + 1) of a record's 64 values of K sits among the 64
// positions of the record's k16 steps, one after another (the B operand's order): value 8c + 4h + 2o
// of a block is at slot 2c + 8o of its step h (place_of's order of K, seen from the activations).
G4_HOST_DEVICE constexpr int staged_column(int pair) {
  const int b = pair / 16, c = (pair % 16) / 4, h = (pair % 4) / 2, o = pair % 2;
  return 32 * b + 16 * h + 2 * c + 8 * o;
}

// Byte offset of the fp16 scale of (row, k) within a record: row-major, a row's two blocks side by side.
G4_HOST_DEVICE constexpr int scale_offset(int row_in_tile, int k_in_record) {
  return kQuantBytes + 4 * row_in_tile + 2 * (k_in_record / 32);
}

// Bytes of an [N, K] matrix in records (N a multiple of 16, K of 64), and where record (tile, chunk)
// starts: a tile's records in K order, tiles one after another.
G4_HOST_DEVICE constexpr size_t matrix_bytes(int64_t N, int64_t K) { return size_t(N / kTileRows) * size_t(K / kValues) * kBytes; }
G4_HOST_DEVICE constexpr size_t record_offset(int64_t K, int64_t tile, int64_t chunk) {
  return (size_t(tile) * size_t(K / kValues) + size_t(chunk)) * kBytes;
}

// Record (tile, chunk) from the matrix's GGUF Q4_0 blocks: block_of(row, b) gives block b of `row`
// as its 18 GGUF bytes (fp16 d, then weight i in the low nibble of byte 2 + i and weight 16 + i in
// its high nibble), wherever the blocks are kept.
struct GgufBlock {
  uint8_t bytes[kGgufBlockBytes];
};
template <typename BlockOf>
G4_HOST_DEVICE void pack_record(BlockOf&& block_of, int64_t tile, int64_t chunk, uint8_t* record) {
  for (int i = 0; i < kBytes; ++i) record[i] = 0;
  for (int r = 0; r < kTileRows; ++r) {
    for (int b = 0; b < kValues / 32; ++b) {
      const GgufBlock block = block_of(tile * kTileRows + r, chunk * 2 + b);
      record[scale_offset(r, 32 * b)] = block.bytes[0];
      record[scale_offset(r, 32 * b) + 1] = block.bytes[1];
      for (int i = 0; i < 32; ++i) {
        const int q = i < 16 ? block.bytes[2 + i] & 15 : block.bytes[2 + i - 16] >> 4;
        const Place p = place_of(r, 32 * b + i);
        record[16 * p.lane + 4 * p.word + p.shift / 8] |= uint8_t(q << (p.shift % 8));
      }
    }
  }
}
// ... of a matrix in GGUF form (`gguf`: rows of K / 32 blocks).
G4_HOST_DEVICE void pack_q4_0_record(const uint8_t* gguf, int64_t K, int64_t tile, int64_t chunk, uint8_t* record) {
  pack_record(
      [&](int64_t row, int64_t b) {
        GgufBlock block;
        const uint8_t* at = gguf + (size_t(row) * size_t(K / 32) + size_t(b)) * kGgufBlockBytes;
        for (int i = 0; i < kGgufBlockBytes; ++i) block.bytes[i] = at[i];
        return block;
      },
      tile, chunk, record);
}

// Whether an [N, K] matrix can be kept in records.
G4_HOST_DEVICE constexpr bool fits_records(int64_t N, int64_t K) { return N > 0 && K > 0 && N % kTileRows == 0 && K % kValues == 0; }

// The quant (0..15) and the fp16 scale bits of (row, k) of a record.
G4_HOST_DEVICE int quant_at(const uint8_t* record, int row_in_tile, int k_in_record) {
  const Place p = place_of(row_in_tile, k_in_record);
  return (record[16 * p.lane + 4 * p.word + p.shift / 8] >> (p.shift % 8)) & 15;
}
G4_HOST_DEVICE uint16_t scale_bits_at(const uint8_t* record, int row_in_tile, int k_in_record) {
  const int at = scale_offset(row_in_tile, k_in_record);
  return uint16_t(record[at] | record[at + 1] << 8);
}

}  // namespace g4::records
