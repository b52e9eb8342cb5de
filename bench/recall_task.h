// The long-context key-value recall task of tools/fixtures/recall_task.py in C++: its prompts rebuilt
// from a cases file's "generator" with splitmix64, draw for draw, and checked against the answers and
// prompt hashes the file lists. Shared by bench_recall and tests/test_recall.cpp.
#pragma once
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace g4::recall {

// Steele, Lea and Flood's splitmix64, as recall_task.py's SplitMix64.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int32_t below(int64_t n) { return int32_t(next() % uint64_t(n)); }
};

// The cases file's "generator": what recall_case reads.
struct Generator {
  uint64_t base_seed = 0;
  int32_t bos = 0, key_marker = 0, value_marker = 0, ask_marker = 0, content_first = 0;
  int64_t content_count = 0, key_len = 0, value_len = 0, records = 0, near_misses = 0, cases_per_length = 0;
  int64_t record_len() const { return 2 + key_len + value_len; }
};

inline int64_t integer_field(const nlohmann::json& j, const char* name, int64_t lo, int64_t hi) {
  G4_CHECK(j.contains(name) && j[name].is_number_integer(), std::string("cases file: generator.") + name +
                                                                 " must be an integer");
  const int64_t v = j[name].get<int64_t>();
  G4_CHECK(v >= lo && v <= hi, std::string("cases file: generator.") + name + " = " + std::to_string(v) +
                                   " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

inline Generator read_generator(const nlohmann::json& file) {
  G4_CHECK(file.is_object() && file.contains("generator") && file["generator"].is_object(),
           "cases file: no 'generator' object (expected a recall_cases.json of tools/fixtures)");
  const nlohmann::json& j = file["generator"];
  constexpr int64_t kIdMax = std::numeric_limits<int32_t>::max();
  Generator g;
  g.base_seed = uint64_t(integer_field(j, "base_seed", 0, (int64_t(1) << 24) - 1));
  g.bos = int32_t(integer_field(j, "bos", 0, kIdMax));
  g.key_marker = int32_t(integer_field(j, "key_marker", 0, kIdMax));
  g.value_marker = int32_t(integer_field(j, "value_marker", 0, kIdMax));
  g.ask_marker = int32_t(integer_field(j, "ask_marker", 0, kIdMax));
  g.content_first = int32_t(integer_field(j, "content_first", 0, kIdMax));
  g.content_count = integer_field(j, "content_count", 2, kIdMax - g.content_first);
  g.key_len = integer_field(j, "key_len", 1, 64);
  g.value_len = integer_field(j, "value_len", 1, 64);
  g.records = integer_field(j, "records", 1, 1 << 16);
  g.near_misses = integer_field(j, "near_misses", 0, g.records - 1);
  g.cases_per_length = integer_field(j, "cases_per_length", 1, (1 << 20) - 1);
  return g;
}

struct RecallCase {
  int64_t length = 0, index = 0, depth_permille = 0;
  std::vector<int32_t> prompt, answer;
};

// recall_task.py's recall_case, draw for draw: the depth, the filler, the asked key and value,
// then each other record's key (near misses first), value and start.
inline RecallCase make_case(const Generator& g, int64_t length, int64_t index) {
  const int64_t record_len = g.record_len();
  const int64_t query_start = length - (2 + g.key_len);
  const int64_t span = query_start - 1 - record_len;
  G4_CHECK(length < (int64_t(1) << 20) && index < (int64_t(1) << 20) && query_start - 1 >= 4 * g.records * record_len,
           "no recall case of " + std::to_string(length) + " positions with " + std::to_string(g.records) +
               " records: a length needs at least " + std::to_string(4 * g.records * record_len + 3 + g.key_len) +
               " positions and less than 1048576");
  SplitMix64 rng{(g.base_seed << 40) | (uint64_t(length) << 20) | uint64_t(index)};
  auto draw = [&](int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = g.content_first + rng.below(g.content_count);
    return ids;
  };
  RecallCase c;
  c.length = length;
  c.index = index;
  c.depth_permille = rng.below(1001);
  std::vector<int32_t> tokens = draw(query_start - 1);
  tokens.insert(tokens.begin(), g.bos);
  const std::vector<int32_t> key = draw(g.key_len), value = draw(g.value_len);
  auto place = [&](int64_t start, const std::vector<int32_t>& k, const std::vector<int32_t>& v) {
    auto at = tokens.begin() + start;
    *at++ = g.key_marker;
    at = std::copy(k.begin(), k.end(), at);
    *at++ = g.value_marker;
    std::copy(v.begin(), v.end(), at);
  };
  const int64_t target = 1 + span * c.depth_permille / 1000;
  place(target, key, value);
  std::vector<int64_t> starts{target};
  for (int64_t r = 0; r + 1 < g.records; ++r) {
    std::vector<int32_t> k;
    if (r < g.near_misses) {
      k = key;
      const int32_t j = rng.below(g.key_len);
      k[size_t(j)] = g.content_first +
                     int32_t((k[size_t(j)] - g.content_first + 1 + rng.below(g.content_count - 1)) % g.content_count);
    } else {
      do k = draw(g.key_len);
      while (k == key);
    }
    std::vector<int32_t> v;
    do v = draw(g.value_len);
    while (v == value);
    auto overlaps = [&](int64_t start) {
      return std::any_of(starts.begin(), starts.end(), [&](int64_t s) { return std::abs(start - s) < record_len; });
    };
    int64_t start = 0;
    do start = 1 + rng.below(span + 1);
    while (overlaps(start));
    place(start, k, v);
    starts.push_back(start);
  }
  tokens.push_back(g.ask_marker);
  tokens.insert(tokens.end(), key.begin(), key.end());
  tokens.push_back(g.value_marker);
  c.prompt = std::move(tokens);
  c.answer = value;
  return c;
}

// FNV-1a 64 over each id's 4 little-endian bytes, as recall_task.py's fnv1a64.
inline std::string fnv1a64(std::span<const int32_t> ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const int32_t id : ids) {
    for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(id) >> (8 * b)) & 0xFFu)) * 0x100000001B3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  return hex;
}

// The cases file's entry for `length` ("lengths" -> "4096" -> {"cases": [...], ...}), or null when
// it lists none.
inline const nlohmann::json* listed_length(const nlohmann::json& file, int64_t length) {
  if (!file.contains("lengths") || !file["lengths"].is_object()) return nullptr;
  const auto it = file["lengths"].find(std::to_string(length));
  return it == file["lengths"].end() ? nullptr : &*it;
}

// Throws unless every case the file lists for this length (among `cases`) has the answer, depth
// and prompt hash that make_case gives: the two generators must agree id for id.
inline void check_against_file(const nlohmann::json& listed, std::span<const RecallCase> cases) {
  G4_CHECK(listed.contains("cases") && listed["cases"].is_array(), "cases file: a length without a 'cases' list");
  for (const nlohmann::json& entry : listed["cases"]) {
    G4_CHECK(entry.contains("index") && entry["index"].is_number_integer(), "cases file: a case without an index");
    const int64_t index = entry["index"].get<int64_t>();
    if (index < 0 || index >= int64_t(cases.size())) continue;
    const RecallCase& c = cases[size_t(index)];
    const std::string where = "case " + std::to_string(index) + " of " + std::to_string(c.length) + " positions";
    G4_CHECK(entry.value("answer", std::vector<int32_t>{}) == c.answer &&
                 entry.value("depth_permille", int64_t(-1)) == c.depth_permille &&
                 entry.value("prompt_fnv1a64", std::string()) == fnv1a64(c.prompt),
             where + " differs from the cases file (answer, depth or prompt hash): bench/recall_task.h's generator "
                     "and recall_task.py's recall_case disagree");
  }
}

// The first `count` cases of `length` positions, checked against the file's list when it has one.
inline std::vector<RecallCase> cases_of_length(const nlohmann::json& file, const Generator& g, int64_t length,
                                               int64_t count) {
  std::vector<RecallCase> cases;
  for (int64_t i = 0; i < count; ++i) cases.push_back(make_case(g, length, i));
  if (const nlohmann::json* listed = listed_length(file, length)) check_against_file(*listed, cases);
  return cases;
}

}  // namespace g4::recall
