#include "support/fixtures.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

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
