// Deterministic mutation fuzzing for the file inputs (GGUF, checkpoint directory, tokenizer.json):
// a seeded generator and a fixed number of runs, so every machine runs the same inputs. The
// environment variable G4_FUZZ_RUNS replaces the run count for long sessions (tools/ci/sanitize.sh
// --fuzz) and G4_FUZZ_SEED the seed.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace g4::test {

// G4_FUZZ_RUNS when set (a positive integer), else `default_runs`.
uint64_t fuzz_runs(uint64_t default_runs);
// G4_FUZZ_SEED when set, else `default_seed`.
uint64_t fuzz_seed(uint64_t default_seed);

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  uint64_t next() { return rng_(); }
  size_t pick(size_t n) { return n == 0 ? 0 : size_t(rng_() % n); }

  // 1-4 byte-level edits: bit flips, random bytes, extreme little-endian integers, truncation,
  // splices of `bytes`' own pieces. Edits fall in [begin, end) (end 0 = the whole buffer).
  void mutate_bytes(std::vector<uint8_t>& bytes, size_t begin = 0, size_t end = 0);
  // 1-3 structural edits of a JSON document: a value anywhere in the tree is replaced by an
  // extreme or ill-typed one (huge, negative, fractional, NaN-like, string, null, array), removed,
  // or an array is shortened or lengthened. Numbers are the interesting targets, so they are
  // picked most often.
  void mutate_json(nlohmann::json& doc);

 private:
  nlohmann::json extreme_value(const nlohmann::json& old);
  std::mt19937_64 rng_;
};

// Files under tests/fuzz-corpus/<kind>/ (inputs that once crashed; replayed first by each fuzzer).
std::vector<std::string> fuzz_corpus(const std::string& kind);

}  // namespace g4::test
