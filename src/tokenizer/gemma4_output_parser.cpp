#include "tokenizer/gemma4_output_parser.h"

#include <algorithm>
#include <array>
#include <span>

#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace g4 {

using nlohmann::json;

namespace {

constexpr size_t kMaxChannelName = 64;  // "thought"; a longer first line is taken as the thought itself
constexpr int kMaxDepth = 64;           // nesting of arguments; deeper is malformed (and bounds recursion)

// The length of the longest end of `text` that is a proper beginning of one of `markers`: what must
// be held back because the next piece may complete a marker.
size_t partial_marker_length(std::string_view text, std::span<const std::string_view> markers) {
  size_t longest = 0;
  for (std::string_view marker : markers)
    for (size_t n = std::min(marker.size() - 1, text.size()); n > longest; --n)
      if (text.substr(text.size() - n) == marker.substr(0, n)) {
        longest = n;
        break;
      }
  return longest;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

// A recursive-descent reader of one call body; every method returns false on anything unexpected.
class CallReader {
 public:
  explicit CallReader(std::string_view text) : text_(text) {}

  std::optional<ParsedToolCall> call() {
    ParsedToolCall call;
    if (!consume("call:")) return std::nullopt;
    while (at_ < text_.size() && is_name_char(text_[at_])) call.name += text_[at_++];
    skip_space();
    if (call.name.empty() || !object(call.arguments, 0)) return std::nullopt;
    skip_space();
    if (at_ != text_.size()) return std::nullopt;
    return call;
  }

 private:
  bool consume(std::string_view token) {
    if (text_.substr(at_, token.size()) != token) return false;
    at_ += token.size();
    return true;
  }
  void skip_space() {
    while (at_ < text_.size() && is_space(text_[at_])) ++at_;
  }

  bool string(std::string& out) {
    if (!consume(kGemma4Quote)) return false;
    const size_t end = text_.find(kGemma4Quote, at_);
    if (end == std::string_view::npos) return false;
    out = std::string(text_.substr(at_, end - at_));
    at_ = end + kGemma4Quote.size();
    return utf8::is_valid(out);  // a JSON string must be UTF-8
  }

  // A bare key runs to the ':' (spaces around it dropped); one between <|"|> is taken as it is.
  bool key(std::string& out) {
    if (text_.substr(at_, kGemma4Quote.size()) == kGemma4Quote) return string(out);
    const size_t colon = text_.find(':', at_);
    if (colon == std::string_view::npos) return false;
    std::string_view bare = text_.substr(at_, colon - at_);
    while (!bare.empty() && is_space(bare.back())) bare.remove_suffix(1);
    if (bare.empty() || bare.find_first_of("{}[],\n") != std::string_view::npos ||
        bare.find(kGemma4Quote) != std::string_view::npos)
      return false;
    out = std::string(bare);
    at_ += bare.size();
    return utf8::is_valid(out);
  }

  // "{…}" or "[…]": items separated by commas, whitespace allowed around them.
  template <typename ReadItem>
  bool items(std::string_view open, std::string_view close, int depth, ReadItem&& read_item) {
    if (depth > kMaxDepth || !consume(open)) return false;
    skip_space();
    if (consume(close)) return true;
    for (;;) {
      skip_space();
      if (!read_item()) return false;
      skip_space();
      if (consume(close)) return true;
      if (!consume(",")) return false;
    }
  }

  bool object(json& out, int depth) {
    out = json::object();
    return items("{", "}", depth, [&] {
      std::string name;
      json item;
      if (!key(name)) return false;
      skip_space();
      if (!consume(":") || !value(item, depth + 1)) return false;
      out[name] = std::move(item);
      return true;
    });
  }

  bool array(json& out, int depth) {
    out = json::array();
    return items("[", "]", depth, [&] {
      json item;
      if (!value(item, depth + 1)) return false;
      out.push_back(std::move(item));
      return true;
    });
  }

  // JSON's number grammar, read by the JSON library (which refuses what does not fit a double).
  bool number(json& out) {
    const size_t start = at_;
    while (at_ < text_.size() && std::string_view("0123456789+-.eE").find(text_[at_]) != std::string_view::npos) ++at_;
    if (at_ == start) return false;
    try {
      out = json::parse(text_.substr(start, at_ - start));
    } catch (const json::exception&) {
      return false;
    }
    return out.is_number();
  }

  bool value(json& out, int depth) {
    skip_space();
    if (depth > kMaxDepth || at_ >= text_.size()) return false;
    if (text_.substr(at_, kGemma4Quote.size()) == kGemma4Quote) {
      std::string s;
      if (!string(s)) return false;
      out = std::move(s);
      return true;
    }
    if (text_[at_] == '{') return object(out, depth);
    if (text_[at_] == '[') return array(out, depth);
    if (consume("true")) return out = true, true;
    if (consume("false")) return out = false, true;
    if (consume("null") || consume("None")) return out = nullptr, true;
    return number(out);
  }

  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace

std::optional<ParsedToolCall> parse_gemma4_tool_call(std::string_view body) { return CallReader(body).call(); }

void ParsedOutput::append(ParsedOutput other) {
  content += other.content;
  reasoning += other.reasoning;
  for (ParsedToolCall& call : other.tool_calls) tool_calls.push_back(std::move(call));
}

ParsedOutput Gemma4OutputParser::push(std::string_view text) {
  ParsedOutput out;
  pending_.append(text);
  advance(out, /*final=*/false);
  return out;
}

ParsedOutput Gemma4OutputParser::finish() {
  ParsedOutput out;
  advance(out, /*final=*/true);
  return out;
}

void Gemma4OutputParser::advance(ParsedOutput& out, bool final) {
  for (bool progressed = true; progressed;) {
    switch (state_) {
      case State::kContent: progressed = advance_content(out, final); break;
      case State::kChannelName: progressed = advance_channel_name(final); break;
      case State::kReasoning: progressed = advance_reasoning(out, final); break;
      case State::kToolCall: progressed = advance_tool_call(out, final); break;
    }
  }
}

// Content runs to the next thought or call; a stray "<channel|>" is dropped (as the template's
// strip_thinking drops it from history).
bool Gemma4OutputParser::advance_content(ParsedOutput& out, bool final) {
  std::array<std::string_view, 3> markers = {kChannelOpen, kChannelClose, kToolCallOpen};
  const std::span<const std::string_view> active(markers.data(), options_.parse_tool_calls ? 3 : 2);
  size_t first = std::string::npos;
  std::string_view found;
  for (std::string_view marker : active)
    if (const size_t at = pending_.find(marker); at < first) first = at, found = marker;
  if (first != std::string::npos) {
    out.content.append(pending_, 0, first);
    pending_.erase(0, first + found.size());
    state_ = found == kChannelOpen ? State::kChannelName : found == kToolCallOpen ? State::kToolCall : State::kContent;
    return true;
  }
  const size_t held = final ? 0 : partial_marker_length(pending_, active);
  out.content.append(pending_, 0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return false;
}

// The channel's name ("thought") up to its newline is not part of the thought. A first line longer
// than kMaxChannelName is the thought itself: decided only once any newline or "<channel|>"
// starting within the limit would be complete, so that the split of the text changes nothing.
bool Gemma4OutputParser::advance_channel_name(bool final) {
  const size_t newline = pending_.find('\n'), close = pending_.find(kChannelClose);
  if (std::min(newline, close) <= kMaxChannelName) {
    const bool empty_thought = close < newline;  // "<|channel>name<channel|>"
    pending_.erase(0, empty_thought ? close + kChannelClose.size() : newline + 1);
    state_ = empty_thought ? State::kContent : State::kReasoning;
    return true;
  }
  if (pending_.size() > kMaxChannelName + kChannelClose.size() || (final && pending_.size() > kMaxChannelName)) {
    state_ = State::kReasoning;
    return true;
  }
  if (final) pending_.clear();  // an unfinished channel name
  return false;
}

bool Gemma4OutputParser::advance_reasoning(ParsedOutput& out, bool final) {
  if (const size_t close = pending_.find(kChannelClose); close != std::string::npos) {
    out.reasoning.append(pending_, 0, close);
    pending_.erase(0, close + kChannelClose.size());
    state_ = State::kContent;
    return true;
  }
  const std::array<std::string_view, 1> markers = {kChannelClose};
  const size_t held = final ? 0 : partial_marker_length(pending_, markers);
  out.reasoning.append(pending_, 0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return false;
}

// A call ends at the first "<tool_call|>" outside a <|"|> string; one that does not parse, or never
// ends, is given back as the content it is.
bool Gemma4OutputParser::advance_tool_call(ParsedOutput& out, bool final) {
  bool in_string = false;
  size_t end = std::string::npos;
  for (size_t at = 0; at < pending_.size();) {
    if (pending_.compare(at, kGemma4Quote.size(), kGemma4Quote) == 0) {
      in_string = !in_string;
      at += kGemma4Quote.size();
    } else if (!in_string && pending_.compare(at, kToolCallClose.size(), kToolCallClose) == 0) {
      end = at;
      break;
    } else {
      ++at;
    }
  }
  if (end == std::string::npos) {
    if (!final) return false;
    out.content.append(kToolCallOpen).append(pending_);
    pending_.clear();
    state_ = State::kContent;
    return false;
  }
  const std::string_view body = std::string_view(pending_).substr(0, end);
  if (std::optional<ParsedToolCall> call = parse_gemma4_tool_call(body)) {
    out.tool_calls.push_back(std::move(*call));
  } else {
    out.content.append(kToolCallOpen).append(body).append(kToolCallClose);
  }
  pending_.erase(0, end + kToolCallClose.size());
  state_ = State::kContent;
  return true;
}

}  // namespace g4
