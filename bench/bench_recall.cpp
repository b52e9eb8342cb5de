// Long-context key-value recall under each KV cache type: the fixture of tests/fixtures/recall (an
// induction circuit built by tools/fixtures/build_recall_model.py) finds the record "KEY k VAL v"
// that a prompt's final "ASK k VAL" asks among random filler and 15 other records. For every KV
// type (full/sliding) and prompt length, each case is prefilled and its answer decoded greedily; the
// JSON printed gives exact recall (cases whose whole answer is right), per-token accuracy, the
// margins of the expected ids (their logit minus the largest other) and the wall time, beside the
// cases file's float64 forward of the same cases (build_recall_model.py's reference).
//
// usage: bench_recall MODEL_DIR_OR_GGUF CASES_JSON [--backend cpu|cuda] [--lengths 4096,16384,65536]
//                     [--kv bf16/bf16,q8_0/q8_0,tq4/bf16,tq4/q8_0] [--cases N]
//
// CASES_JSON is the fixture's recall_cases.json: the prompts are rebuilt from its generator
// parameters with splitmix64, exactly as tools/fixtures/recall_task.py's recall_case builds them
// (bench/recall_task.h), and checked against the answers and prompt hashes listed there. A length
// the file does not list gets cases from the same generator (without a reference). --lengths
// defaults to the file's lengths, --cases (the first N of each length) to the file's
// cases_per_length.
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
#include "recall_task.h"
#include "runtime/model_runner.h"
#include "runtime/session.h"
#include "util/error.h"
#include "util/files.h"

namespace {

using nlohmann::json;

namespace recall = g4::recall;
using recall::RecallCase;

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
  const recall::Generator g = recall::read_generator(file);
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
    cases.push_back(recall::cases_of_length(file, g, length, per_length));
    const json* listed = recall::listed_length(file, length);
    if (listed && listed->contains("float64")) reference[std::to_string(length)] = (*listed)["float64"];
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
                       {"results", results},          {"float64", reference}};
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
