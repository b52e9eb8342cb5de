#include "support/fixtures.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

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
  r.positions = j["logits_shape"][0];
  r.vocab = j["logits_shape"][1];
  r.logits.resize(size_t(r.positions * r.vocab));
  std::ifstream bin(r.dir + "/reference_logits.f32", std::ios::binary);
  bin.read(reinterpret_cast<char*>(r.logits.data()), std::streamsize(r.logits.size() * 4));
  if (!bin) throw std::runtime_error("short reference_logits.f32 in " + r.dir);
  return r;
}

}  // namespace

Reference load_reference(const std::string& name) { return load_reference_dir(fixture_dir(name)); }

Reference load_demo_reference() { return load_reference_dir(std::string(G4_FIXTURES_DIR) + "/demo/transformers"); }

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as a failure
  }
  return m;
}

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::path(G4_CACHE_DIR) / "tmp" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
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

CommandResult run_g4(const std::string& arguments) {
  CommandResult result;
  result.exit_code = run_command(std::string(G4_BINARY) + " " + arguments, &result.output);
  return result;
}

}  // namespace g4::test
