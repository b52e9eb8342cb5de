// UTF-8 helpers shared by the tokenizer (input validation, char splitting) and decoding.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace g4::utf8 {

// U+FFFD, what decoding writes for each byte that is not part of a valid UTF-8 sequence.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Length of the well-formed UTF-8 sequence (RFC 3629: no overlongs, surrogates or code points
// above U+10FFFF) that starts at text[pos]: 1..4 when complete and valid, 0 when the bytes
// from pos are invalid, and -1 when they are a valid but truncated prefix of a sequence.
int sequence_length(std::string_view text, size_t pos);

// True when the whole text is well-formed UTF-8 (a truncated final sequence is not).
bool is_valid(std::string_view text);

// Throws g4::Error naming `what`, the offending byte and its offset unless text is valid UTF-8.
void require_valid(std::string_view text, std::string_view what);

// Consumes `bytes` from the front and returns them as valid UTF-8: complete sequences are
// copied, every byte that cannot be part of one becomes U+FFFD. With keep_incomplete_tail, a
// trailing valid-but-unfinished sequence stays in `bytes` (more may follow); otherwise it too
// becomes U+FFFD per byte and `bytes` ends empty.
std::string take_valid(std::string& bytes, bool keep_incomplete_tail);

}  // namespace g4::utf8
