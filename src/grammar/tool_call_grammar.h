// Forced tool calls in Gemma 4's own call syntax (docs/DESIGN.md §4, "Constrained decoding"): the
// text "<|tool_call>call:NAME{key:value,…}<tool_call|>" that the chat template writes for a call and
// parse_gemma4_tool_call reads back. Values are in the template's syntax (ValueSyntax::kGemma4):
// keys bare and in the template's order (sorted case-insensitively), strings between <|"|> holding
// any UTF-8 text without <|"|>, numbers as JSON writes them, true, false and None, objects
// {k:v,…} and arrays [a,…] without spaces.
//
// The grammar's markers are Gemma's control tokens: a TokenVocabulary counts them as text only when
// given them as text_markers (kGemma4ToolCallMarkers).
#pragma once
#include <array>
#include <span>
#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace g4::grammar {

struct ToolGrammarFunction {
  std::string name;             // [A-Za-z0-9_.-]{1,64}
  std::string parameters_json;  // the JSON Schema of the arguments object; empty: any object
};

// The tokens the tool-call grammar writes: a call's start and end, the string delimiter.
inline constexpr std::array<std::string_view, 3> kGemma4ToolCallMarkers = {"<|tool_call>", "<tool_call|>", "<|\"|>"};

// One or more calls, each "<|tool_call>call:NAME{ARGS}<tool_call|>" with nothing between them: NAME
// one of `functions`, ARGS the members of an object valid against its parameters schema (the JSON
// Schema subset of json_schema.h, its errors prefixed with the function's name). No functions, a
// name outside [A-Za-z0-9_.-]{1,64} or a name given twice is Error(kInvalidArgument); a property
// name (or additional key) that is no identifier [A-Za-z_][A-Za-z0-9_]*, Error(kUnsupported).
// Strings with minLength/maxLength hold no '<' (so that their characters are counted simply).
Grammar gemma4_tool_calls_grammar(std::span<const ToolGrammarFunction> functions);

}  // namespace g4::grammar
