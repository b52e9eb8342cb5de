// TQ4, TurboQuant 4-bit: the KV cache format of full-attention layers that stores a head vector of
// d values (d a power of two) in d / 2 + 2 bytes (docs/DESIGN.md, "Quantized KV: TQ4"). The vector
// is rotated by a fixed random orthogonal matrix R = H·S / √d (S a fixed ±1 diagonal, H Sylvester's
// Hadamard matrix), its L2 norm kept in bf16, and each rotated coordinate, divided by the norm and
// multiplied by √d (about N(0, 1) for any vector), stored as the 4-bit index of its cell in the
// 16-level Lloyd–Max codebook of N(0, 1). Decoding is x̂ = norm · Rᵀ c / √d. Attention can work in
// the rotated space instead: q·x̂ = norm / √d · (R q)·c.
//
// The reference implementation: double arithmetic in a fixed order, so that
// tools/fixtures/tq4_oracle.py (float64 Python) pins its codes, norms and decoded values bit for bit.
#pragma once
#include <array>
#include <cstdint>
#include <span>

namespace g4::tq4 {

inline constexpr int kLevels = 16;

// The Lloyd–Max levels of N(0, 1), ascending and exactly symmetric, computed once (a fixed number of
// Lloyd rounds in double), and the 15 boundaries between them (midpoints).
const std::array<double, kLevels>& codebook();
const std::array<double, kLevels - 1>& boundaries();

// The rotation's diagonal: sign i of S (+1 or -1), the same for every d (a prefix of one sequence).
double sign(int64_t i);

// Throws Error(kInvalidArgument) unless d is a power of two from 2 to 65 536.
void check_dim(int64_t d);

// Encodes x (d values): returns the norm as bf16 bits and writes d codes, one per byte (0..15), to
// `codes`.
uint16_t encode(std::span<const float> x, std::span<uint8_t> codes);
// Decodes d codes and a bf16 norm into d floats.
void decode(uint16_t norm_bits, std::span<const uint8_t> codes, std::span<float> out);

// Attention in the rotated space, in float (the KV caches' reference and the CUDA kernels' form):
// rotate(v) makes v H·S·v, rotate_back(v) makes v S·H·v, in place (the same butterfly as encode),
// so that rotate_back(rotate(v)) = d·v; codebook_f32() is codebook() rounded to float. With a query
// rotated once, q·x̂ = norm / d · Σ rotate(q)_i · codebook_f32()[code_i]; a weighted sum of values
// is Σ w·norm / d · codebook_f32()[code] accumulated per coordinate, then rotate_back once.
void rotate(std::span<float> v);
void rotate_back(std::span<float> v);
const std::array<float, kLevels>& codebook_f32();

// Packs codes two to a byte (code 2i in the low nibble of byte i), and back.
void pack_codes(std::span<const uint8_t> codes, std::span<uint8_t> packed);
void unpack_codes(std::span<const uint8_t> packed, std::span<uint8_t> codes);

// Bytes of one encoded head vector of d values: the codes' d / 2, then the bf16 norm.
inline constexpr int64_t vector_bytes(int64_t d) { return d / 2 + 2; }

}  // namespace g4::tq4
