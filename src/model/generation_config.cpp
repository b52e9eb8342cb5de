#include "model/generation_config.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"

namespace g4 {

namespace {

constexpr const char* kTemperature = "g4.generation.temperature";
constexpr const char* kTopK = "g4.generation.top_k";
constexpr const char* kTopP = "g4.generation.top_p";
constexpr const char* kMinP = "g4.generation.min_p";

template <typename T>
std::optional<T> field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  G4_CHECK(j[key].is_number(), "'" + path + "': '" + key + "' must be a number");
  return j[key].get<T>();
}

}  // namespace

GenerationDefaults read_generation_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  GenerationDefaults d;
  if (!std::filesystem::exists(path)) return d;
  const nlohmann::json j = read_json_file(path);
  G4_CHECK(j.is_object(), "'" + path + "' is not a JSON object");
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>()) {
    d.temperature = 0.0f;
    return d;
  }
  d.temperature = field<float>(j, "temperature", path);
  d.top_k = field<int32_t>(j, "top_k", path);
  d.top_p = field<float>(j, "top_p", path);
  d.min_p = field<float>(j, "min_p", path);
  return d;
}

void write_generation_defaults(const GenerationDefaults& d, GgufMetadata& m) {
  if (d.temperature) m.set(kTemperature, GgufValue(*d.temperature));
  if (d.top_k) m.set(kTopK, GgufValue(*d.top_k));
  if (d.top_p) m.set(kTopP, GgufValue(*d.top_p));
  if (d.min_p) m.set(kMinP, GgufValue(*d.min_p));
}

GenerationDefaults read_generation_defaults(const GgufMetadata& m) {
  GenerationDefaults d;
  if (m.find(kTemperature)) d.temperature = float(m.get_float(kTemperature));
  if (m.find(kTopK)) d.top_k = int32_t(m.get_int(kTopK));
  if (m.find(kTopP)) d.top_p = float(m.get_float(kTopP));
  if (m.find(kMinP)) d.min_p = float(m.get_float(kMinP));
  return d;
}

}  // namespace g4
