// Gemma 4's reply, read as it streams (docs/DESIGN.md §8): the text the model writes, split into
// what the user reads (content), its thoughts ("<|channel>thought\n…<channel|>" → reasoning) and its
// tool calls ("<|tool_call>call:NAME{key:value,…}<tool_call|>", strings between <|"|>, the syntax
// chat_template.h writes). The inverse of the chat format, so it lives beside it.
//
//   Gemma4OutputParser parser({.parse_tool_calls = true});
//   for (piece : decoded text with special tokens) use(parser.push(piece));
//   use(parser.finish());
#pragma once
#include <array>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace g4 {

// The markers of a reply: a thought's start and end, a call's start and end, the string delimiter.
inline constexpr std::string_view kChannelOpen = "<|channel>", kChannelClose = "<channel|>";
inline constexpr std::string_view kToolCallOpen = "<|tool_call>", kToolCallClose = "<tool_call|>";
inline constexpr std::array<std::string_view, 5> kGemma4OutputMarkers = {kChannelOpen, kChannelClose, kToolCallOpen,
                                                                         kToolCallClose, "<|\"|>"};

struct ParsedToolCall {
  std::string name;
  nlohmann::json arguments;  // an object
};

// What one push made final. Text that might begin a marker is held back until it is known.
struct ParsedOutput {
  std::string content, reasoning;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(ParsedOutput other);
};

// Parses the body of one call, "call:NAME{key:value,…}" (what lies between <|tool_call> and
// <tool_call|>): values are <|"|>strings<|"|>, numbers, true, false, null (or None), {objects}
// and [arrays], keys bare or between <|"|>, whitespace allowed between items. nullopt when it is
// not exactly that (nesting deeper than 64 included): the caller keeps the text as content.
std::optional<ParsedToolCall> parse_gemma4_tool_call(std::string_view body);

struct OutputParserOptions {
  // Tool calls become ParsedToolCalls; off, their text stays content (a request without tools).
  bool parse_tool_calls = true;
};

class Gemma4OutputParser {
 public:
  explicit Gemma4OutputParser(OutputParserOptions options = {}) : options_(options) {}

  // Adds text (whole characters, special tokens as their strings); returns what became final.
  ParsedOutput push(std::string_view text);
  // The reply ended: what was held back is final (an unfinished call as the content it is).
  ParsedOutput finish();

 private:
  enum class State { kContent, kChannelName, kReasoning, kToolCall };
  // Consumes pending_ as far as it can be decided; `final` decides everything.
  void advance(ParsedOutput& out, bool final);
  bool advance_content(ParsedOutput& out, bool final);
  bool advance_channel_name(bool final);
  bool advance_reasoning(ParsedOutput& out, bool final);
  bool advance_tool_call(ParsedOutput& out, bool final);

  OutputParserOptions options_;
  State state_ = State::kContent;
  std::string pending_;  // text not yet decided
};

}  // namespace g4
