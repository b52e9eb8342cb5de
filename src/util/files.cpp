#include "util/files.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace g4 {

std::string read_file(const std::string& path) {
  // An ifstream reads a directory as empty, and a FIFO or device would block or never end: the
  // files g4 reads are regular files.
  std::error_code ec;
  G4_CHECK(!std::filesystem::is_directory(path, ec), "cannot read '" + path + "': it is a directory");
  G4_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
           "cannot read '" + path + "': it is not a regular file");
  G4_REQUIRE(kNotFound, std::filesystem::exists(path, ec), "cannot read '" + path + "': no such file");
  std::ifstream in(path, std::ios::binary);
  G4_CHECK(in.good(), "cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  G4_CHECK(!in.bad(), "cannot read '" + path + "'");
  return text.str();
}

std::optional<std::string> read_file_if_exists(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  return read_file(path);
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error("malformed JSON in '" + path + "': " + e.what());
  }
}

std::string unique_temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

}  // namespace g4
