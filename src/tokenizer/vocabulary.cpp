#include "tokenizer/vocabulary.h"

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace g4 {

int32_t token_id_from_json(const nlohmann::json& value, const std::string& what) {
  const bool fits = value.is_number_unsigned()  ? value.get<uint64_t>() <= uint64_t(INT32_MAX)
                    : value.is_number_integer() ? value.get<int64_t>() >= 0 && value.get<int64_t>() <= INT32_MAX
                                                : false;
  G4_CHECK(fits, "tokenizer.json: " + what + " has id " + value.dump() + ", not an integer in [0, 2^31)");
  return static_cast<int32_t>(value.get<int64_t>());
}

void Vocabulary::assign(int32_t id, std::string token) {
  G4_CHECK(id >= 0, "tokenizer: negative token id " + std::to_string(id) + " for '" + token + "'");
  G4_CHECK(static_cast<size_t>(id) < limit_, "tokenizer: token id " + std::to_string(id) + " for '" + token +
                                                 "' is not below the number of entries (" + std::to_string(limit_) +
                                                 "); ids must be dense");
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
