#include "support/fixtures.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "util/error.h"
#include "util/files.h"

namespace g4::test {

std::string fixture_dir(const std::string& name) { return std::string(G4_FIXTURES_DIR) + "/hf-gemma4/" + name; }

namespace {

// A reference (reference.json + reference_logits.f32) in `dir`.
Reference load_reference_dir(const std::string& dir) {
  Reference r;
  r.dir = dir;
  std::ifstream meta(r.dir + "/reference.json");
  if (!meta) throw std::runtime_error("missing " + r.dir + "/reference.json");
  auto j = nlohmann::json::parse(meta);
  r.tokens = j["token_ids"].get<std::vector<int32_t>>();
  r.positions = int64_t(r.tokens.size());
  r.vocab = j["logits_shape"][1];
  if (j.contains("rows")) {
    r.rows = j["rows"].get<std::vector<int64_t>>();
  } else {
    for (int64_t p = 0; p < r.positions; ++p) r.rows.push_back(p);
  }
  if (int64_t(r.rows.size()) != j["logits_shape"][0].get<int64_t>())
    throw std::runtime_error("reference.json in " + dir + ": rows and logits_shape disagree");
  r.logits.resize(r.rows.size() * size_t(r.vocab));
  std::ifstream bin(r.dir + "/reference_logits.f32", std::ios::binary);
  bin.read(reinterpret_cast<char*>(r.logits.data()), std::streamsize(r.logits.size() * 4));
  if (!bin) throw std::runtime_error("short reference_logits.f32 in " + r.dir);
  if (j.contains("top2_margin")) {
    r.greedy_next = j["greedy_next"].get<std::vector<int32_t>>();
    r.top2_margin = j["top2_margin"].get<std::vector<float>>();
  } else {  // every row stored: derive them
    for (int64_t p = 0; p < r.positions; ++p) {
      std::vector<float> row(r.logits.begin() + p * r.vocab, r.logits.begin() + (p + 1) * r.vocab);
      const auto best = std::max_element(row.begin(), row.end());
      r.greedy_next.push_back(int32_t(best - row.begin()));
      const float top = *best;
      *best = -INFINITY;
      r.top2_margin.push_back(top - *std::max_element(row.begin(), row.end()));
    }
  }
  for (auto [key, error] : {std::pair{"transformers_bfloat16", &r.transformers_bf16},
                            std::pair{"transformers_float32", &r.transformers_f32}}) {
    if (!j.contains(key)) continue;
    error->relative_l2 = j[key]["relative_l2"];
    error->clear_greedy_agreement = j[key]["clear_greedy_agreement"];
  }
  return r;
}

}  // namespace

Reference load_reference(const std::string& name) { return load_reference_dir(fixture_dir(name)); }

Reference load_demo_reference() { return load_reference_dir(std::string(G4_FIXTURES_DIR) + "/demo/transformers"); }

std::vector<float> stored_rows(const std::vector<float>& every_position, const Reference& ref) {
  if (every_position.size() != size_t(ref.positions * ref.vocab)) return {};
  std::vector<float> out;
  out.reserve(ref.rows.size() * size_t(ref.vocab));
  for (int64_t p : ref.rows)
    out.insert(out.end(), every_position.begin() + p * ref.vocab, every_position.begin() + (p + 1) * ref.vocab);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as a failure
  }
  return m;
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    error += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(error / std::max(norm, 1e-30));
}

GreedyAgreement greedy_agreement(const std::vector<float>& every_position, const Reference& ref) {
  GreedyAgreement g;
  if (every_position.size() != size_t(ref.positions * ref.vocab)) return g;
  for (int64_t p = 0; p < ref.positions; ++p) {
    if (ref.top2_margin[size_t(p)] <= kClearMargin) continue;
    ++g.clear;
    const auto row = every_position.begin() + p * ref.vocab;
    if (std::max_element(row, row + ref.vocab) - row == ref.greedy_next[size_t(p)]) {
      ++g.agreed;
    } else if (g.first_disagreement < 0) {
      g.first_disagreement = p;
    }
  }
  return g;
}

namespace {

// Removes the process's temporary directories when it exits.
struct TemporaryDirectories {
  std::vector<std::filesystem::path> paths;
  ~TemporaryDirectories() {
    std::error_code ignored;
    for (const auto& p : paths) std::filesystem::remove_all(p, ignored);
  }
};

}  // namespace

std::string temp_dir(const std::string& name) {
  static TemporaryDirectories created;
  static int counter = 0;
  auto dir = std::filesystem::path(G4_CACHE_DIR) / "tmp" /
             (name + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  created.paths.push_back(dir);
  return dir.string();
}

std::string shared_artifact(const std::string& name, const std::function<void(const std::string& path)>& make) {
  const std::filesystem::path path = std::filesystem::path(G4_CACHE_DIR) / name;
  std::filesystem::create_directories(path.parent_path());
  const int fd = open((path.string() + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + path.string());
  try {
    if (!std::filesystem::exists(path)) {
      const std::string tmp = unique_temporary_name(path.string());
      make(tmp);
      std::filesystem::rename(tmp, path);
    }
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  return path.string();
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no g4::Error thrown)";
}

ErrorKind error_kind_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no g4::Error thrown";
  return ErrorKind::kInternal;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::string write_floats(const std::vector<float>& values, const std::string& name) {
  const std::string path = temp_dir("floats") + "/" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size() * sizeof(float)));
  return path;
}

bool gpu_required() {
  const char* v = std::getenv("G4_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

int run_command(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  std::string out;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

CommandResult run_g4(const std::string& arguments, const std::string& environment) {
  CommandResult result;
  const std::string prefix = environment.empty() ? "" : "env " + environment + " ";
  result.exit_code = run_command(prefix + G4_BINARY + " " + arguments, &result.output);
  return result;
}

}  // namespace g4::test
