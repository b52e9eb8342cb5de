// The grammars of constrained replies (docs/DESIGN.md §4 "Constrained decoding", §8): a request's
// ReplyConstraint compiled against the server's vocabulary, kept and shared by every request that
// asks for the same thing (the per-position token classes a grammar gathers are what makes its later
// requests cheap). Thread-safe: handler threads compile, the engine thread reads.
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "serve/openai_api.h"

namespace g4 {
class Tokenizer;
}

namespace g4::serve {

class ReplyGrammars {
 public:
  // stop_ids: the tokens that end a reply (those the grammars end on); vocab_size: the model's.
  ReplyGrammars(const Tokenizer& tokenizer, std::vector<int32_t> stop_ids, int64_t vocab_size, size_t capacity = 64);

  // The compiled grammar of the request's constraint; null when it has none. Throws ApiError (400,
  // naming response_format or tools) when a schema is malformed or outside the supported subset.
  std::shared_ptr<const grammar::CompiledGrammar> get(const CompletionRequest& request);

 private:
  // Gemma's call markers count as text for tool calls only; JSON never holds them.
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary(bool tool_calls);
  // Under mutex_ (compiling builds rules only; token classes are gathered as matchers ask).
  std::shared_ptr<const grammar::CompiledGrammar> compile(const CompletionRequest& request);

  const Tokenizer& tokenizer_;
  std::vector<int32_t> stop_ids_;
  int64_t vocab_size_;
  size_t capacity_;
  std::mutex mutex_;
  std::shared_ptr<const grammar::TokenVocabulary> json_vocabulary_, tool_vocabulary_;
  std::list<std::string> recent_;  // keys, most recently used first
  std::map<std::string, std::pair<std::shared_ptr<const grammar::CompiledGrammar>, std::list<std::string>::iterator>>
      compiled_;
};

}  // namespace g4::serve
