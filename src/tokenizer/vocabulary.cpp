#include "tokenizer/vocabulary.h"

#include "util/error.h"

namespace g4 {

void Vocabulary::assign(int32_t id, std::string token) {
  G4_CHECK(id >= 0, "tokenizer: negative token id " + std::to_string(id) + " for '" + token + "'");
  if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1);
  ids_.insert_or_assign(token, id);
  tokens_[static_cast<size_t>(id)] = std::move(token);
}

std::optional<int32_t> Vocabulary::find(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void Vocabulary::reserve(size_t count) {
  tokens_.reserve(count);
  ids_.reserve(count);
}

}  // namespace g4
