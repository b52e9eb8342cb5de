#include "tokenizer/utf8.h"

#include <cstdint>
#include <cstdio>

#include "util/error.h"

namespace g4::utf8 {
namespace {

// Lead byte → sequence length, or 0 for a byte that cannot start a sequence
// (continuation bytes 80..BF, overlong leads C0/C1, and F5..FF beyond U+10FFFF).
int length_from_lead(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// The allowed range of the second byte depends on the lead (Unicode Table 3-7): this is what
// rules out overlong forms, UTF-16 surrogates and code points above U+10FFFF.
bool second_byte_ok(uint8_t lead, uint8_t second) {
  uint8_t low = 0x80, high = 0xBF;
  if (lead == 0xE0) low = 0xA0;
  if (lead == 0xED) high = 0x9F;
  if (lead == 0xF0) low = 0x90;
  if (lead == 0xF4) high = 0x8F;
  return second >= low && second <= high;
}

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

}  // namespace

int sequence_length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const int length = length_from_lead(byte(0));
  if (length <= 1) return length;
  const size_t available = text.size() - pos;
  for (size_t i = 1; i < static_cast<size_t>(length); ++i) {
    if (i >= available) return -1;
    const bool ok = i == 1 ? second_byte_ok(byte(0), byte(1)) : is_continuation(byte(i));
    if (!ok) return 0;
  }
  return length;
}

bool is_valid(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const int length = sequence_length(text, pos);
    if (length <= 0) return false;
    pos += static_cast<size_t>(length);
  }
  return true;
}

void require_valid(std::string_view text, std::string_view what) {
  for (size_t pos = 0; pos < text.size();) {
    const int length = sequence_length(text, pos);
    if (length <= 0) {
      char detail[96];
      std::snprintf(detail, sizeof detail, " is not valid UTF-8: %s byte 0x%02X at offset %zu",
                    length < 0 ? "truncated sequence at" : "invalid",
                    static_cast<uint8_t>(text[pos]), pos);
      throw Error(std::string(what) + detail);
    }
    pos += static_cast<size_t>(length);
  }
}

std::string take_valid(std::string& bytes, bool keep_incomplete_tail) {
  std::string text;
  text.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const int length = sequence_length(bytes, pos);
    if (length < 0 && keep_incomplete_tail) break;
    if (length <= 0) {
      text += kReplacementChar;
      ++pos;
      continue;
    }
    text.append(bytes, pos, static_cast<size_t>(length));
    pos += static_cast<size_t>(length);
  }
  bytes.erase(0, pos);
  return text;
}

}  // namespace g4::utf8
