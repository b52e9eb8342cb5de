#include "grammar/tool_call_grammar.h"

#include <set>

#include "grammar/json_schema.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/gemma4_output_parser.h"
#include "util/error.h"

namespace g4::grammar {
namespace {

static_assert(kGemma4ToolCallMarkers[0] == kToolCallOpen && kGemma4ToolCallMarkers[1] == kToolCallClose &&
              kGemma4ToolCallMarkers[2] == kGemma4Quote);

bool is_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
          c == '-'))
      return false;
  return true;
}

}  // namespace

Grammar gemma4_tool_calls_grammar(std::span<const ToolGrammarFunction> functions) {
  G4_CHECK(!functions.empty(), "tool call grammar: no functions");
  GrammarBuilder builder;
  SchemaConverter converter(builder, ValueSyntax::kGemma4);
  // named ::= NAME ARGS | …, one alternative per function.
  const int32_t named = builder.add_rule();
  std::set<std::string, std::less<>> names;
  for (const ToolGrammarFunction& function : functions) {
    G4_CHECK(is_function_name(function.name),
             "tool call grammar: function name '" + function.name + "' is not [A-Za-z0-9_.-]{1,64}");
    G4_CHECK(names.insert(function.name).second, "tool call grammar: function '" + function.name + "' given twice");
    int32_t arguments;
    try {
      arguments = converter.object_rule(function.parameters_json.empty() ? std::string_view(R"({"type":"object"})")
                                                                         : std::string_view(function.parameters_json));
    } catch (const Error& e) {
      throw Error(e.kind(), "function '" + function.name + "' parameters: " + e.what());
    }
    GrammarBuilder::Sequence s = builder.literal(function.name);
    s.push_back(builder.ref(arguments));
    builder.add_alternative(named, std::move(s));
  }
  GrammarBuilder::Sequence call = builder.literal(std::string(kToolCallOpen) + "call:");
  call.push_back(builder.ref(named));
  const GrammarBuilder::Sequence close = builder.literal(kToolCallClose);
  call.insert(call.end(), close.begin(), close.end());
  return builder.build(builder.repeat(call, 1, -1));
}

}  // namespace g4::grammar
