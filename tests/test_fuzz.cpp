// Mutation fuzzing of the three file inputs, in process: a GGUF model, a Hugging Face checkpoint
// directory (config.json + model.safetensors) and tokenizer.json. Every mutated input must load
// and run, or fail with g4::Error; anything else (a crash, an escaped exception, a sanitizer
// report under tools/ci/sanitize.sh) is a defect. Seeds and run counts are fixed, so every machine
// runs the same inputs; G4_FUZZ_RUNS / G4_FUZZ_SEED change them for long runs. Inputs that once
// crashed are kept in tests/fuzz-corpus/ and replayed first.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <typeinfo>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "format/gguf.h"
#include "model/hf_checkpoint.h"
#include "format/safetensors.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "support/fuzz.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Loads the model and runs a few positions (RoPE tables, attention windows and the logits all
// depend on config values). Returns whether it loaded; throws g4::Error otherwise.
bool load_and_run(const std::string& path) {
  CpuBackend backend(1);
  auto model = load_model(path, backend);
  Session s(*model, backend);  // the default context: min(max_position_embeddings, 4096)
  const std::vector<int32_t> tokens{2, 1, 3, 4};
  s.logits_all(tokens);
  return true;
}

struct Tally {
  uint64_t runs = 0, accepted = 0;
  // Runs one input: it loads (run returns true), or fails with g4::Error; anything else escaping
  // is a defect.
  void attempt(const std::string& what, const std::function<bool()>& run) {
    ++runs;
    try {
      accepted += run();
    } catch (const Error& e) {
      if (std::getenv("G4_FUZZ_VERBOSE")) std::printf("%s: %s\n", what.c_str(), e.what());
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": escaped " << typeid(e).name() << ": " << e.what();
    }
  }
  void print(const char* what) const {
    std::printf("%s: %llu inputs, %llu loaded, the rest rejected with g4::Error\n", what,
                static_cast<unsigned long long>(runs), static_cast<unsigned long long>(accepted));
  }
};

// --- checkpoint directory ---------------------------------------------------------------------------

struct SafetensorsParts {
  json header;
  std::string data;
};

SafetensorsParts split_safetensors(const std::string& bytes) {
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  return {json::parse(bytes.substr(8, len)), bytes.substr(8 + len)};
}

std::string join_safetensors(const json& header, const std::string& data) {
  const std::string text = header.dump();
  const uint64_t len = text.size();
  return std::string(reinterpret_cast<const char*>(&len), 8) + text + data;
}

TEST(Fuzz, CheckpointDirectory) {
  const std::string fixture = test::fixture_dir("tiny-31b-style-bf16");
  const std::string dir = test::temp_dir("fuzz_checkpoint");
  const std::string config = read_text(fixture + "/config.json");
  const std::string weights = read_text(fixture + "/model.safetensors");
  const SafetensorsParts parts = split_safetensors(weights);
  write_text(dir + "/model.safetensors", weights);
  Tally tally;
  auto attempt = [&](const std::string& what) { tally.attempt(what, [&] { return load_and_run(dir); }); };
  for (const std::string& seed : test::fuzz_corpus("checkpoint")) {  // config.json files
    write_text(dir + "/config.json", read_text(seed));
    attempt(seed);
  }
  test::Mutator mutator(test::fuzz_seed(1));
  const uint64_t runs = test::fuzz_runs(300);
  for (uint64_t run = 0; run < runs; ++run) {
    const uint64_t kind = mutator.next() % 8;
    if (kind < 5) {  // config.json, structurally
      json c = json::parse(config);
      mutator.mutate_json(c);
      write_text(dir + "/config.json", c.dump());
    } else if (kind < 6) {  // config.json, as bytes
      std::vector<uint8_t> bytes(config.begin(), config.end());
      mutator.mutate_bytes(bytes);
      write_text(dir + "/config.json", std::string(bytes.begin(), bytes.end()));
    } else {  // the safetensors header, structurally or as bytes
      write_text(dir + "/config.json", config);
      std::string mutated;
      if (kind == 6) {
        json h = parts.header;
        mutator.mutate_json(h);
        mutated = join_safetensors(h, parts.data);
      } else {
        std::vector<uint8_t> bytes(weights.begin(), weights.end());
        mutator.mutate_bytes(bytes, 0, 8 + parts.header.dump().size());
        mutated.assign(bytes.begin(), bytes.end());
      }
      write_text(dir + "/model.safetensors", mutated);
    }
    attempt("run " + std::to_string(run));
    if (kind >= 6) write_text(dir + "/model.safetensors", weights);
  }
  tally.print("checkpoint fuzz");
}

// --- GGUF model -------------------------------------------------------------------------------------

// An extreme or ill-typed metadata value.
GgufValue extreme_gguf_value(test::Mutator& m, const GgufValue& old) {
  switch (m.next() % 14) {
    case 0: return uint32_t(0);
    case 1: return uint32_t(0xffffffffu);
    case 2: return int32_t(-1);
    case 3: return uint64_t(1) << 40;
    case 4: return int64_t(-(int64_t(1) << 62));
    case 5: return 1e30f;
    case 6: return -1.0f;
    case 7: return std::numeric_limits<float>::quiet_NaN();
    case 8: return std::numeric_limits<float>::infinity();
    case 9: return true;
    case 10: return std::string("x");
    case 11: return GgufValue::array_of(std::vector<int32_t>{1, 2, 3});
    case 12: return GgufValue::array_of(std::vector<bool>{true});
    default:
      if (old.type() == GgufType::U32) return uint32_t(old.to_int("") + 1);
      return uint32_t(1);
  }
}

TEST(Fuzz, GgufModel) {
  const std::string dir = test::temp_dir("fuzz_gguf");
  // Two seeds: bf16 weights, and 4-bit blocks (Q4_0 matrices, a Q8_0 embedding) whose scales the
  // byte mutations below also reach.
  std::vector<std::unique_ptr<GgufFile>> seeds;
  std::vector<std::string> seed_texts;
  for (DType type : {DType::BF16, DType::Q4_0}) {
    ExportOptions options;
    options.weights = type;
    const std::string file = dir + "/seed-" + dtype_name(type) + ".gguf";
    export_gguf(HfCheckpoint(test::fixture_dir("tiny-31b-style")), file, options);
    seeds.push_back(std::make_unique<GgufFile>(file));
    seed_texts.push_back(read_text(file));
  }
  const std::string path = dir + "/mutated.gguf";
  Tally tally;
  auto attempt = [&](const std::string& file, const std::string& what) {
    tally.attempt(what, [&] { return load_and_run(file); });
  };
  for (const std::string& file : test::fuzz_corpus("gguf")) attempt(file, file);
  test::Mutator mutator(test::fuzz_seed(2));
  const uint64_t runs = test::fuzz_runs(300);
  for (uint64_t run = 0; run < runs; ++run) {
    const size_t which = mutator.pick(seeds.size());
    const GgufFile& seed = *seeds[which];
    const std::string& seed_bytes = seed_texts[which];
    if (const uint64_t kind = mutator.next() % 4; kind <= 1) {  // bytes of the header, or of the weights
      std::vector<uint8_t> bytes(seed_bytes.begin(), seed_bytes.end());
      if (kind == 0) {
        mutator.mutate_bytes(bytes, 0, seed.data_offset());
      } else {
        mutator.mutate_bytes(bytes, seed.data_offset(), bytes.size());
      }
      write_text(path, std::string(bytes.begin(), bytes.end()));
    } else {  // values, keys and shapes, written by the writer so that the container stays valid
      std::vector<std::pair<std::string, GgufValue>> entries = seed.metadata().entries();
      std::vector<GgufTensorPlan> plans;
      for (const GgufTensorInfo& info : seed.tensors()) plans.push_back({info.name, info.shape(), info.dtype});
      const int edits = 1 + int(mutator.next() % 3);
      for (int e = 0; e < edits; ++e) {
        const uint64_t op = mutator.next() % 6;
        if (op == 0 && !entries.empty()) {
          entries.erase(entries.begin() + long(mutator.pick(entries.size())));
        } else if (op == 1) {  // a shape with the same element count, or a dropped dimension
          GgufTensorPlan& p = plans[mutator.pick(plans.size())];
          if (p.shape.size() == 2) std::swap(p.shape[0], p.shape[1]);
        } else if (op == 2) {
          entries.emplace_back("general.alignment", GgufValue(uint32_t(1u << mutator.pick(7))));
        } else if (!entries.empty()) {
          auto& entry = entries[mutator.pick(entries.size())];
          if (entry.first == "general.alignment") continue;
          entry.second = extreme_gguf_value(mutator, entry.second);
        }
      }
      GgufMetadata m;
      for (const auto& [k, v] : entries) m.set(k, v);
      try {
        GgufWriter writer(path, m, plans);
        for (const GgufTensorInfo& info : seed.tensors()) {
          const HostTensor t = seed.tensor(info);
          writer.append(t.data, t.bytes);
        }
        writer.finish();
      } catch (const Error&) {
        continue;  // the writer refused the edit (e.g. an alignment that is not a power of two)
      }
    }
    attempt(path, "run " + std::to_string(run));
  }
  tally.print("GGUF model fuzz");
}

// --- tokenizer.json ---------------------------------------------------------------------------------

std::string demo_tokenizer_json() {
  return GgufFile(test::fortune_demo_path()).metadata().get_string(gguf_key::kTokenizerJson);
}

// Builds the tokenizer and uses it: encode (with and without special tokens), decode, stream.
bool tokenize_with(const std::string& text) {
  const Tokenizer tok = Tokenizer::from_json(text);
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode("Hello, w\xc3\xb6rld! <bos>ab  \n\tmore 123 \xf0\x9f\x98\x80", special);
    tok.decode(ids, special);
    StreamDecoder stream(tok, special);
    for (int32_t id : ids) stream.push(id);
    stream.flush();
  }
  for (int32_t id = 0; id < std::min(tok.vocab_size(), 300); ++id) tok.token(id);
  return true;
}

TEST(Fuzz, TokenizerJson) {
  const std::string seed = demo_tokenizer_json();
  const json parsed = json::parse(seed);
  Tally tally;
  auto attempt = [&](const std::string& text, const std::string& what) {
    tally.attempt(what, [&] { return tokenize_with(text); });
  };
  for (const std::string& file : test::fuzz_corpus("tokenizer")) attempt(read_text(file), file);
  test::Mutator mutator(test::fuzz_seed(3));
  const uint64_t runs = test::fuzz_runs(200);
  for (uint64_t run = 0; run < runs; ++run) {
    std::string text;
    if (mutator.next() % 5 == 0) {
      std::vector<uint8_t> bytes(seed.begin(), seed.end());
      mutator.mutate_bytes(bytes);
      text.assign(bytes.begin(), bytes.end());
    } else {
      json t = parsed;
      mutator.mutate_json(t);
      text = t.dump();
    }
    attempt(text, "run " + std::to_string(run));
  }
  tally.print("tokenizer fuzz");
}

}  // namespace
}  // namespace g4
