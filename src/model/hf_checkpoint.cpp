#include "model/hf_checkpoint.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"

namespace g4 {

namespace fs = std::filesystem;
using nlohmann::json;

std::string canonical_text_name(const std::string& n) {
  std::string rest;
  if (n.rfind("model.language_model.", 0) == 0) {
    rest = n.substr(21);
  } else if (n.rfind("model.", 0) == 0) {
    rest = n.substr(6);
  } else {
    rest = n;
  }
  // An assistant's projections between its width and the target's (model/assistant.h).
  for (const char* keep : {"pre_projection.", "post_projection."})
    if (rest.rfind(keep, 0) == 0) return rest;
  if (n == "lm_head.weight") return n;
  if (rest == n) return "";
  for (const char* keep : {"layers.", "embed_tokens.", "norm."})
    if (rest.rfind(keep, 0) == 0) return rest;
  return "";
}

static std::vector<std::string> shard_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    const fs::path single = dir / "model.safetensors";
    G4_REQUIRE(kNotFound, fs::exists(single), "missing weights: neither '" + single.string() + "' nor '" + index.string() + "' exists");
    return {single.string()};
  }
  const json j = read_json_file(index.string());
  G4_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "'" + index.string() + "' has no weight_map");
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    G4_CHECK(file.is_string(), "'" + index.string() + "': weight_map entry '" + name + "' is not a file name");
    files.insert(file.get<std::string>());
  }
  std::vector<std::string> paths;
  for (const auto& f : files) {
    // Shards are plain file names beside the index; a path would read outside the model directory.
    G4_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
             "'" + index.string() + "': shard name '" + f + "' is not a file name in the model directory");
    const fs::path shard = dir / f;
    G4_REQUIRE(kNotFound, fs::exists(shard), "missing shard: '" + index.string() + "' names '" + f + "', which does not exist");
    paths.push_back(shard.string());
  }
  return paths;
}

HfCheckpoint::HfCheckpoint(const std::string& dir, ModelRole role) : dir_(dir) {
  G4_REQUIRE(kNotFound, fs::is_directory(dir), "model directory '" + dir + "' does not exist");
  config_ = load_hf_config((fs::path(dir) / "config.json").string(), role);
  for (const auto& path : shard_files(dir)) {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const auto& [name, entry] : files_.back()->entries()) {
      std::string canon = canonical_text_name(name);
      if (canon.empty()) continue;
      G4_CHECK(!canonical_.count(canon), "tensor '" + name + "' appears twice in '" + dir + "'");
      canonical_[canon] = {files_.back().get(), name};
    }
  }
}

ModelRole HfCheckpoint::role_of(const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json";
  G4_REQUIRE(kNotFound, fs::exists(config), "missing config: '" + config.string() + "' does not exist");
  return hf_config_role(read_json_file(config.string()));
}

const HostTensor* HfCheckpoint::find(const std::string& name) const {
  auto hit = loaded_.find(name);
  if (hit != loaded_.end()) return &hit->second;
  auto it = canonical_.find(name);
  if (it == canonical_.end()) return nullptr;
  HostTensor t = it->second.first->tensor(it->second.second);
  t.name = name;
  return &loaded_.emplace(name, std::move(t)).first->second;
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : canonical_) out.push_back(name);
  return out;
}

}  // namespace g4
