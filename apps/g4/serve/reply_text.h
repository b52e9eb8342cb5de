// The text of one reply as it streams out of the model (docs/DESIGN.md §8): generated ids become
// text that is always whole UTF-8 characters; for chat, Gemma4OutputParser splits thoughts and tool
// calls out of it; the content is cut at the first stop string (which is not returned) and never
// shows a client characters that may turn out to begin a stop string.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/gemma4_output_parser.h"
#include "tokenizer/tokenizer.h"

namespace g4::serve {

class ReplyText {
 public:
  // Empty stop strings are ignored (the request parser rejects them). With `parser`, the reply is
  // read as Gemma 4 writes it (its markers' special tokens kept for the parser, other special
  // tokens dropped); without, it is plain text with every special token dropped (/v1/completions).
  ReplyText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
            std::optional<OutputParserOptions> parser = std::nullopt);

  // Adds a generated id; returns what became safe to send (possibly nothing). After a stop string
  // has appeared in the content, stopped() is true and later ids add nothing.
  ParsedOutput push(int32_t id);
  // The generation ended without a stop string: whatever was held back (an unfinished character
  // as U+FFFD, a partial stop-string match or an unfinished call as the text it is).
  ParsedOutput finish();

  bool stopped() const { return stopped_; }

 private:
  ParsedOutput parse(const std::string& text, bool final);
  std::string release(bool final);

  const Tokenizer& tokenizer_;
  StreamDecoder decoder_;
  std::optional<Gemma4OutputParser> parser_;
  std::vector<int32_t> marker_ids_;  // special tokens the parser reads
  std::vector<std::string> stops_;
  std::string text_;   // the content so far (cut at a stop string)
  size_t sent_ = 0;    // bytes of text_ already returned
  bool stopped_ = false;
};

}  // namespace g4::serve
