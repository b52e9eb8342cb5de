// The text of one reply as it streams out of the model (docs/DESIGN.md §8): generated ids become
// text that is always whole UTF-8 characters, cut at the first stop string (which is not returned),
// and never shows a client characters that may turn out to begin a stop string.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace g4::serve {

class ReplyText {
 public:
  // Empty stop strings are ignored (the request parser rejects them).
  ReplyText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  // Adds a generated id; returns the text that became safe to send (possibly empty). After a stop
  // string has appeared, stopped() is true and later ids add nothing.
  std::string push(int32_t id);
  // The generation ended without a stop string: whatever was held back (an unfinished character
  // as U+FFFD, a partial stop-string match as the text it is).
  std::string finish();

  bool stopped() const { return stopped_; }

 private:
  std::string release(bool final);

  StreamDecoder decoder_;
  std::vector<std::string> stops_;
  std::string text_;       // every complete character decoded so far (cut at a stop string)
  size_t sent_ = 0;   // bytes of text_ already returned
  bool stopped_ = false;
};

}  // namespace g4::serve
