// Long-context key-value recall under each KV cache type: the model of tools/fixtures/train_recall.py
// finds the record "KEY k1 k2 k3 VAL v…" that a prompt's final "ASK k1 k2 k3 VAL" asks among
// random filler, 15 other records and two near misses. For every KV type (full/sliding) and prompt
// length, each case is prefilled and its answer decoded greedily; the JSON printed gives exact
// recall (cases whose whole answer is right), per-token accuracy, the margins of the expected ids
// (their logit minus the largest other) and the wall time, beside transformers' bf16 recall of the
// same cases from the cases file.
//
// usage: bench_recall MODEL_DIR_OR_GGUF CASES_JSON [--backend cpu|cuda] [--lengths 4096,16384,65536]
//                     [--kv bf16/bf16,q8_0/q8_0,tq4/bf16,tq4/q8_0] [--cases N]
//
// CASES_JSON is the fixture's recall_cases.json: the prompts are rebuilt from its generator
// parameters with splitmix64, exactly as train_recall.py's recall_case builds them, and checked
// against the answers and prompt hashes listed there. A length the file does not list gets cases
// from the same generator (without a transformers reference). --lengths defaults to the file's
// lengths, --cases (the first N of each length) to the file's cases_per_length.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "model/loader.h"
#include "model/kv_types.h"
#include "runtime/model_runner.h"
#include "runtime/session.h"
#include "util/error.h"
#include "util/files.h"

namespace {

using nlohmann::json;

// Steele, Lea and Flood's splitmix64, as train_recall.py's SplitMix64.
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

int64_t integer_field(const json& j, const char* name, int64_t lo, int64_t hi) {
  G4_CHECK(j.contains(name) && j[name].is_number_integer(), std::string("cases file: generator.") + name +
                                                                 " must be an integer");
  const int64_t v = j[name].get<int64_t>();
  G4_CHECK(v >= lo && v <= hi, std::string("cases file: generator.") + name + " = " + std::to_string(v) +
                                   " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

Generator read_generator(const json& file) {
  G4_CHECK(file.is_object() && file.contains("generator") && file["generator"].is_object(),
           "cases file: no 'generator' object (expected train_recall.py's recall_cases.json)");
  const json& j = file["generator"];
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

// train_recall.py's recall_case, draw for draw: the depth, the filler, the asked key and value,
// then each other record's key (near misses first), value and start.
RecallCase make_case(const Generator& g, int64_t length, int64_t index) {
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

// FNV-1a 64 over each id's 4 little-endian bytes, as train_recall.py's fnv1a64.
std::string fnv1a64(std::span<const int32_t> ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const int32_t id : ids) {
    for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(id) >> (8 * b)) & 0xFFu)) * 0x100000001B3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  return hex;
}

// The cases file's entry for `length` ("lengths" -> "4096" -> {"cases": [...], "transformers_bf16": {...}}),
// or null when it lists none.
const json* listed_length(const json& file, int64_t length) {
  if (!file.contains("lengths") || !file["lengths"].is_object()) return nullptr;
  const auto it = file["lengths"].find(std::to_string(length));
  return it == file["lengths"].end() ? nullptr : &*it;
}

// Throws unless every case the file lists for this length (among `cases`) has the answer, depth
// and prompt hash that make_case gives: the two generators must agree id for id.
void check_against_file(const json& listed, std::span<const RecallCase> cases) {
  G4_CHECK(listed.contains("cases") && listed["cases"].is_array(), "cases file: a length without a 'cases' list");
  for (const json& entry : listed["cases"]) {
    G4_CHECK(entry.contains("index") && entry["index"].is_number_integer(), "cases file: a case without an index");
    const int64_t index = entry["index"].get<int64_t>();
    if (index < 0 || index >= int64_t(cases.size())) continue;
    const RecallCase& c = cases[size_t(index)];
    const std::string where = "case " + std::to_string(index) + " of " + std::to_string(c.length) + " positions";
    G4_CHECK(entry.value("answer", std::vector<int32_t>{}) == c.answer &&
                 entry.value("depth_permille", int64_t(-1)) == c.depth_permille &&
                 entry.value("prompt_fnv1a64", std::string()) == fnv1a64(c.prompt),
             where + " differs from the cases file (answer, depth or prompt hash): bench_recall's generator and "
                     "train_recall.py's recall_case disagree");
  }
}

struct KvChoice {
  g4::KvTypes types;
  std::string name;  // "full/sliding"
};

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t end = s.find(sep, at);
    parts.emplace_back(s.substr(at, end - at));
    if (end == std::string_view::npos) return parts;
    at = end + 1;
  }
}

std::vector<KvChoice> parse_kv_list(std::string_view list) {
  std::vector<KvChoice> out;
  for (const std::string& item : split(list, ',')) {
    const std::vector<std::string> pair = split(item, '/');
    G4_CHECK(pair.size() == 2, "--kv entries are FULL/SLIDING (e.g. tq4/bf16), not '" + item + "'");
    const g4::KvTypes types{g4::parse_kv_type(pair[0], false), g4::parse_kv_type(pair[1], true)};
    out.push_back({types, g4::kv_type_name(types.full) + "/" + g4::kv_type_name(types.sliding)});
  }
  return out;
}

int64_t parse_count(const std::string& text, const std::string& what) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  G4_CHECK(used == text.size() && v > 0, what + " must be a positive integer, not '" + text + "'");
  return v;
}

struct Options {
  std::string model_path, cases_path, backend = "cpu";
  std::vector<int64_t> lengths;  // empty: the cases file's
  std::vector<KvChoice> kv = parse_kv_list("bf16/bf16,q8_0/q8_0,tq4/bf16,tq4/q8_0");
  int64_t cases = 0;  // 0: the generator's cases_per_length
};

Options parse_options(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.starts_with("--")) {
      positional.push_back(arg);
      continue;
    }
    G4_CHECK(i + 1 < argc, arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--backend") {
      G4_CHECK(value == "cpu" || value == "cuda", "--backend must be cpu or cuda, not '" + value + "'");
      o.backend = value;
    } else if (arg == "--lengths") {
      for (const std::string& s : split(value, ',')) o.lengths.push_back(parse_count(s, "--lengths entry"));
    } else if (arg == "--kv") {
      o.kv = parse_kv_list(value);
    } else if (arg == "--cases") {
      o.cases = parse_count(value, "--cases");
    } else {
      G4_CHECK(false, "unknown option " + arg);
    }
  }
  G4_CHECK(positional.size() == 2, "expected MODEL_DIR_OR_GGUF and CASES_JSON, got " +
                                       std::to_string(positional.size()) + " positional arguments");
  o.model_path = positional[0];
  o.cases_path = positional[1];
  return o;
}

// logits[want] minus the largest other logit: positive when greedy decoding picks `want`.
double margin(std::span<const float> logits, int32_t want) {
  float other = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (int32_t(i) != want) other = std::max(other, logits[i]);
  }
  return double(logits[size_t(want)]) - double(other);
}

struct CaseResult {
  std::vector<int32_t> got;
  std::vector<double> margins;
};

// Prefills the prompt from an empty cache and decodes the answer's length greedily.
CaseResult run_case(g4::Session& session, const RecallCase& c) {
  session.reset();
  session.prefill(c.prompt);
  CaseResult r;
  for (size_t step = 0; step < c.answer.size(); ++step) {
    const std::vector<float> logits = session.last_logits_host();
    r.got.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    r.margins.push_back(margin(logits, c.answer[step]));
    if (step + 1 < c.answer.size()) session.decode(r.got.back());
  }
  return r;
}

json measure_length(g4::Session& session, std::span<const RecallCase> cases) {
  int64_t exact = 0, right = 0, answer_ids = 0;
  double margin_sum = 0, min_margin = std::numeric_limits<double>::infinity();
  json misses = json::array();
  const auto start = std::chrono::steady_clock::now();
  for (const RecallCase& c : cases) {
    const CaseResult r = run_case(session, c);
    for (size_t i = 0; i < c.answer.size(); ++i) {
      right += r.got[i] == c.answer[i];
      margin_sum += r.margins[i];
      min_margin = std::min(min_margin, r.margins[i]);
    }
    answer_ids += int64_t(c.answer.size());
    if (r.got == c.answer) {
      ++exact;
    } else {
      misses.push_back({{"index", c.index}, {"depth_permille", c.depth_permille}, {"answer", c.answer}, {"got", r.got}});
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return json{{"length", cases.front().length},
          {"cases", cases.size()},
          {"exact", exact},
          {"exact_recall", double(exact) / double(cases.size())},
          {"token_accuracy", double(right) / double(answer_ids)},
          {"mean_margin", margin_sum / double(answer_ids)},
          {"min_margin", min_margin},
          {"seconds", seconds},
          {"misses", misses}};
}

int run(const Options& o) {
  const json file = g4::read_json_file(o.cases_path);
  const Generator g = read_generator(file);
  std::vector<int64_t> lengths = o.lengths;
  if (lengths.empty() && file.contains("lengths") && file["lengths"].is_object()) {
    for (const auto& [name, _] : file["lengths"].items()) lengths.push_back(parse_count(name, "cases file length"));
    std::sort(lengths.begin(), lengths.end());
  }
  G4_CHECK(!lengths.empty(), "no lengths to run: the cases file lists none and --lengths was not given");
  const int64_t per_length = o.cases > 0 ? o.cases : g.cases_per_length;

  std::vector<std::vector<RecallCase>> cases;
  json reference = json::object();
  for (const int64_t length : lengths) {
    std::vector<RecallCase>& of_length = cases.emplace_back();
    for (int64_t i = 0; i < per_length; ++i) of_length.push_back(make_case(g, length, i));
    if (const json* listed = listed_length(file, length)) {
      check_against_file(*listed, of_length);
      if (listed->contains("transformers_bf16")) reference[std::to_string(length)] = (*listed)["transformers_bf16"];
    }
  }

  auto backend = g4::make_backend(o.backend);
  const auto model = g4::load_model(o.model_path, *backend);
  const g4::ModelConfig& config = model->config();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  g4::SessionOptions so;
  so.max_seq_len = std::max(longest + g.value_len + 1, g4::min_max_seq_len(config));

  json results = json::array();
  for (const KvChoice& kv : o.kv) {
    so.kv_types = kv.types;
    g4::Session session(*model, *backend, so);
    json per_length = json::array();
    for (const std::vector<RecallCase>& of_length : cases) {
      per_length.push_back(measure_length(session, of_length));
      const json& last = per_length.back();
      std::fprintf(stderr, "%s at %" PRId64 ": %" PRId64 "/%zu exact, %.1f s\n", kv.name.c_str(),
                   of_length.front().length, last["exact"].get<int64_t>(), of_length.size(),
                   last["seconds"].get<double>());
    }
    results.push_back({{"kv_type", g4::kv_type_name(kv.types.full)},
                       {"kv_sliding_type", g4::kv_type_name(kv.types.sliding)},
                       {"lengths", per_length}});
  }
  const json report = {{"model", o.model_path},       {"cases_file", o.cases_path}, {"backend", o.backend},
                       {"max_seq_len", so.max_seq_len}, {"cases_per_length", per_length},
                       {"results", results},          {"transformers_bf16", reference}};
  std::printf("%s\n", report.dump(1).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_options(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "bench_recall: %s\nusage: %s MODEL_DIR_OR_GGUF CASES_JSON [--backend cpu|cuda] [--lengths 4096,...] "
                 "[--kv FULL/SLIDING,...] [--cases N]\n",
                 e.what(), argv[0]);
    return 1;
  }
}
