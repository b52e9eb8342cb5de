#include "support/fuzz.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

namespace g4::test {

namespace {

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  return end && *end == '\0' ? uint64_t(v) : fallback;
}

// Every node of the tree, in a fixed order (objects iterate in key order).
void collect(nlohmann::json& node, std::vector<nlohmann::json*>& out) {
  out.push_back(&node);
  if (node.is_object() || node.is_array())
    for (auto& child : node) collect(child, out);
}

}  // namespace

uint64_t fuzz_runs(uint64_t default_runs) {
  const uint64_t runs = env_number("G4_FUZZ_RUNS", default_runs);
  return runs > 0 ? runs : default_runs;
}

uint64_t fuzz_seed(uint64_t default_seed) { return env_number("G4_FUZZ_SEED", default_seed); }

void Mutator::mutate_bytes(std::vector<uint8_t>& bytes, size_t begin, size_t end) {
  const std::vector<uint8_t> seed = bytes;
  const int edits = 1 + int(rng_() % 4);
  for (int e = 0; e < edits && !bytes.empty(); ++e) {
    const size_t hi = std::min(end == 0 ? bytes.size() : end, bytes.size());
    const size_t lo = std::min(begin, hi);
    if (hi == lo) return;
    const size_t at = lo + pick(hi - lo);
    switch (rng_() % 5) {
      case 0: bytes[at] ^= uint8_t(1u << (rng_() % 8)); break;
      case 1: bytes[at] = uint8_t(rng_()); break;
      case 2: {
        const uint64_t extremes[] = {0, 1, 0x7f, 0xff, 0xffffffffu, 0x80000000u, ~uint64_t(0), uint64_t(1) << 62};
        const uint64_t v = extremes[rng_() % std::size(extremes)];
        const size_t width = std::min(std::array<size_t, 3>{1, 4, 8}[rng_() % 3], bytes.size() - at);
        std::memcpy(bytes.data() + at, &v, width);
        break;
      }
      case 3: bytes.resize(at); return;
      case 4: {
        const size_t from = pick(seed.size());
        const size_t n = std::min({size_t(1 + rng_() % 64), seed.size() - from, bytes.size() - at});
        std::memcpy(bytes.data() + at, seed.data() + from, n);
        break;
      }
    }
  }
}

nlohmann::json Mutator::extreme_value(const nlohmann::json& old) {
  switch (rng_() % 16) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 1.5;
    case 3: return 1e9;
    case 4: return -1e30;
    case 5: return std::numeric_limits<int32_t>::max();
    case 6: return int64_t(1) << 40;
    case 7: return std::numeric_limits<uint64_t>::max();
    case 8: return 100000000;
    case 9: return nullptr;
    case 10: return "x";
    case 11: return nlohmann::json::array({1, 2});
    case 12: return nlohmann::json::object();
    case 13: return true;
    case 14: return old.is_number() ? nlohmann::json(old.get<double>() * 2 + 1) : nlohmann::json(0.5);
    default: return old.is_number_integer() ? nlohmann::json(old.get<int64_t>() + int64_t(rng_() % 5) - 2)
                                            : nlohmann::json(1e-45);
  }
}

void Mutator::mutate_json(nlohmann::json& doc) {
  const int edits = 1 + int(rng_() % 3);
  for (int e = 0; e < edits; ++e) {
    std::vector<nlohmann::json*> nodes;
    collect(doc, nodes);
    std::vector<nlohmann::json*> numbers;
    for (auto* n : nodes)
      if (n->is_number()) numbers.push_back(n);
    const bool on_number = !numbers.empty() && rng_() % 3 != 0;
    nlohmann::json& target = on_number ? *numbers[pick(numbers.size())] : *nodes[pick(nodes.size())];
    const uint64_t op = rng_() % 8;
    if (op == 0 && target.is_object() && !target.empty()) {  // drop a key
      auto it = target.begin();
      std::advance(it, long(pick(target.size())));
      target.erase(it);
    } else if (op == 1 && target.is_array() && !target.empty()) {  // shorten an array
      target.erase(target.begin() + long(pick(target.size())));
    } else if (op == 2 && target.is_array() && !target.empty()) {  // lengthen an array
      target.push_back(target[pick(target.size())]);
    } else {
      target = extreme_value(target);
    }
  }
}

std::vector<std::string> fuzz_corpus(const std::string& kind) {
  std::vector<std::string> files;
  const std::filesystem::path dir = std::filesystem::path(G4_SOURCE_DIR) / "tests" / "fuzz-corpus" / kind;
  if (!std::filesystem::is_directory(dir)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace g4::test
