#include "serve/reply_grammars.h"

#include <algorithm>

#include "grammar/json_schema.h"
#include "grammar/tool_call_grammar.h"
#include "tokenizer/tokenizer.h"

namespace g4::serve {

ReplyGrammars::ReplyGrammars(const Tokenizer& tokenizer, std::vector<int32_t> stop_ids, int64_t vocab_size,
                             size_t capacity)
    : tokenizer_(tokenizer), vocab_size_(vocab_size), capacity_(capacity) {
  for (int32_t id : stop_ids)
    if (id >= 0 && id < std::min<int64_t>(vocab_size, tokenizer.vocab_size()) &&
        std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end())
      stop_ids_.push_back(id);
}

std::shared_ptr<const grammar::TokenVocabulary> ReplyGrammars::vocabulary(bool tool_calls) {
  // Under mutex_: built once, at the first request that needs it (~0.2 s for Gemma's vocabulary).
  std::shared_ptr<const grammar::TokenVocabulary>& v = tool_calls ? tool_vocabulary_ : json_vocabulary_;
  if (!v) {
    std::vector<std::string> markers;
    if (tool_calls) markers.assign(grammar::kGemma4ToolCallMarkers.begin(), grammar::kGemma4ToolCallMarkers.end());
    v = std::make_shared<const grammar::TokenVocabulary>(tokenizer_, stop_ids_, int32_t(vocab_size_), markers);
  }
  return v;
}

std::shared_ptr<const grammar::CompiledGrammar> ReplyGrammars::compile(const CompletionRequest& r) {
  const bool tool_calls = r.constraint.kind == ReplyConstraint::Kind::kToolCalls;
  try {
    if (!tool_calls)
      return std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(r.constraint.schema),
                                                              vocabulary(false));
    std::vector<grammar::ToolGrammarFunction> functions;
    for (const nlohmann::json& tool : r.chat.tools) {
      const nlohmann::json& f = tool["function"];
      const std::string name = f["name"].get<std::string>();
      if (!r.constraint.function.empty() && name != r.constraint.function) continue;
      const bool has_parameters = f.contains("parameters") && !f["parameters"].is_null();
      functions.push_back({name, has_parameters ? f["parameters"].dump() : std::string()});
    }
    return std::make_shared<const grammar::CompiledGrammar>(grammar::gemma4_tool_calls_grammar(functions),
                                                            vocabulary(true));
  } catch (const Error& e) {
    const char* param = tool_calls ? "tools" : "response_format";
    throw ApiError(e.kind(), std::string(param) + ": " + e.what(), param,
                   e.kind() == ErrorKind::kUnsupported ? "unsupported_parameter" : "");
  }
}

std::shared_ptr<const grammar::CompiledGrammar> ReplyGrammars::get(const CompletionRequest& r) {
  if (r.constraint.kind == ReplyConstraint::Kind::kNone) return nullptr;
  const std::string key = r.constraint.kind == ReplyConstraint::Kind::kJson
                              ? "json " + r.constraint.schema
                              : "tools " + r.constraint.function + " " + r.chat.tools.dump();
  std::lock_guard lock(mutex_);
  if (auto it = compiled_.find(key); it != compiled_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second.second);
    return it->second.first;
  }
  std::shared_ptr<const grammar::CompiledGrammar> grammar = compile(r);
  recent_.push_front(key);
  compiled_[key] = {grammar, recent_.begin()};
  if (compiled_.size() > capacity_) {
    compiled_.erase(recent_.back());
    recent_.pop_back();
  }
  return grammar;
}

}  // namespace g4::serve
