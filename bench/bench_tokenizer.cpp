// Tokenizer throughput: encodes a ~100 000-token text (the test corpus, repeated) and prints
// tokens/s, plus load, decode and streaming-decode times.
// usage: bench_tokenizer TOKENIZER_JSON CORPUS_DIR   (e.g. tests/tokenizer/corpus)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

constexpr size_t kTargetTokens = 100'000;
constexpr int kRepetitions = 5;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <typename Action>
double median_seconds(Action action) {
  std::vector<double> times;
  for (int i = 0; i < kRepetitions; ++i) {
    const auto start = std::chrono::steady_clock::now();
    action();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::string corpus_text(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream content;
    content << in.rdbuf();
    text += content.str();
  }
  G4_CHECK(!text.empty(), "no corpus text in " + directory.string());
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS_DIR\n", argv[0]);
    return 2;
  }
  try {
    auto start = std::chrono::steady_clock::now();
    const g4::Tokenizer tokenizer = g4::Tokenizer::from_file(argv[1]);
    const double load_s = seconds_since(start);

    const std::string corpus = corpus_text(argv[2]);
    const size_t corpus_tokens = tokenizer.encode(corpus, true).size();
    std::string text;
    for (size_t tokens = 0; tokens < kTargetTokens; tokens += corpus_tokens) text += corpus;

    std::vector<int32_t> ids;
    const double encode_s = median_seconds([&] { ids = tokenizer.encode(text, true); });
    std::string decoded;
    const double decode_s = median_seconds([&] { decoded = tokenizer.decode(ids); });
    const double stream_s = median_seconds([&] {
      g4::StreamDecoder stream(tokenizer);
      for (const int32_t id : ids) decoded = stream.push(id);
    });

    std::printf("load tokenizer.json      %8.3f s\n", load_s);
    std::printf("text                     %8zu bytes, %zu tokens\n", text.size(), ids.size());
    std::printf("encode                   %8.4f s  %12.0f tokens/s  %6.1f MB/s\n", encode_s, ids.size() / encode_s,
                text.size() / encode_s / 1e6);
    std::printf("decode                   %8.4f s  %12.0f tokens/s\n", decode_s, ids.size() / decode_s);
    std::printf("stream decode (per id)   %8.4f s  %12.0f tokens/s\n", stream_s, ids.size() / stream_s);
  } catch (const g4::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
