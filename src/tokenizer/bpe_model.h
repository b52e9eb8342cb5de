// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): merges applied
// by rank over the characters of one pre-token, with SentencePiece-style byte fallback.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/vocabulary.h"

namespace g4 {

class BpeModel {
 public:
  // Reads vocab and merges of the "model" object into vocab; throws g4::Error on a model type
  // other than BPE, options this implementation does not have, or merges naming unknown tokens.
  static BpeModel from_json(const nlohmann::json& model, Vocabulary& vocab);

  // Appends the ids of one pre-token (valid UTF-8, already normalized).
  void encode(std::string_view word, const Vocabulary& vocab, std::vector<int32_t>& ids) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  // Open-addressing map (left id, right id) → merge: the rank lookup is the inner loop of BPE.
  class MergeTable {
   public:
    // Sizes the table for `count` pairs; insert() never grows it (load factor stays <= 1/2).
    void reserve(size_t count);
    void insert(int32_t left, int32_t right, Merge merge);
    const Merge* find(int32_t left, int32_t right) const;

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
      uint64_t key = kEmpty;
      Merge merge{};
    };
    size_t slot_of(uint64_t key) const;
    std::vector<Slot> slots_;
    size_t mask_ = 0;
  };

  void load_merges(const nlohmann::json& merges, const Vocabulary& vocab);
  // Appends the initial symbols of one character: its token, else its byte tokens, else <unk>.
  void push_char_symbols(std::string_view character, const Vocabulary& vocab,
                         std::vector<int32_t>& symbols) const;
  void apply_merges(std::vector<int32_t>& symbols) const;

  MergeTable merges_;
  std::vector<std::optional<int32_t>> byte_ids_ = std::vector<std::optional<int32_t>>(256);
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
};

}  // namespace g4
