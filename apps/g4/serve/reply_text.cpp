#include "serve/reply_text.h"

#include <algorithm>
#include <string_view>

namespace g4::serve {

ReplyText::ReplyText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                     std::optional<OutputParserOptions> parser)
    : tokenizer_(tokenizer), decoder_(tokenizer, /*skip_special=*/!parser) {
  for (std::string& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
  if (!parser) return;
  parser_.emplace(*parser);
  for (std::string_view marker : kGemma4OutputMarkers)
    if (std::optional<int32_t> id = tokenizer.token_id(marker)) marker_ids_.push_back(*id);
}

ParsedOutput ReplyText::push(int32_t id) {
  if (stopped_) return {};
  const bool dropped = parser_ && tokenizer_.is_special(id) &&
                       std::find(marker_ids_.begin(), marker_ids_.end(), id) == marker_ids_.end();
  // Whole characters only: UTF-8 hold-back is the decoder's.
  return parse(dropped ? std::string() : decoder_.push(id), /*final=*/false);
}

ParsedOutput ReplyText::finish() {
  if (stopped_) return {};
  return parse(decoder_.flush(), /*final=*/true);
}

ParsedOutput ReplyText::parse(const std::string& text, bool final) {
  ParsedOutput out;
  if (parser_) {
    out = parser_->push(text);
    if (final) out.append(parser_->finish());
  } else {
    out.content = text;
  }
  text_ += out.content;
  out.content = release(final);
  return out;
}

std::string ReplyText::release(bool final) {
  // A stop string can only newly appear where it overlaps text not yet sent: everything sent
  // was checked to hold no match.
  size_t longest = 0;
  for (const std::string& s : stops_) longest = std::max(longest, s.size());
  const size_t from = sent_ > longest ? sent_ - longest : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, text_.find(s, from));
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
    final = true;
  }
  // Hold back the longest end of the text that begins some stop string: the next token may
  // complete it. (It starts on a character boundary: a stop string begins with a whole character.)
  size_t held = 0;
  if (!final) {
    for (const std::string& s : stops_)
      for (size_t n = std::min(s.size() - 1, text_.size() - sent_); n > held; --n)
        if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
          held = n;
          break;
        }
  }
  const size_t end = text_.size() - held;
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

}  // namespace g4::serve
