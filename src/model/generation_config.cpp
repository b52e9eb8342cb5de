#include "model/generation_config.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"

namespace g4 {

namespace {

// llama.cpp's keys (its converter writes them from generation_config.json and its tools read them);
// files exported by earlier g4 versions carry the same values under g4.generation.*.
constexpr const char* kTemperature = "general.sampling.temp";
constexpr const char* kTopK = "general.sampling.top_k";
constexpr const char* kTopP = "general.sampling.top_p";
constexpr const char* kMinP = "general.sampling.min_p";
constexpr const char* kLegacyPrefix = "g4.generation.";
constexpr const char* kNumAssistantTokens = "g4.num_assistant_tokens";

int64_t checked_assistant_tokens(int64_t n, const std::string& where) {
  G4_CHECK(n >= 1, where + ": num_assistant_tokens must be a positive integer, got " + std::to_string(n));
  return n;
}

// The key holding a default: llama.cpp's, else its g4.generation.<name> predecessor; nullptr if neither.
const char* key_of_default(const GgufMetadata& m, const char* key, const std::string& legacy_key) {
  if (m.find(key)) return key;
  return m.find(legacy_key) ? legacy_key.c_str() : nullptr;
}

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

std::optional<int64_t> read_num_assistant_tokens(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json j = read_json_file(path);
  G4_CHECK(j.is_object(), "'" + path + "' is not a JSON object");
  const char* key = "num_assistant_tokens";
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  G4_CHECK(j[key].is_number_integer(), "'" + path + "': '" + key + "' must be an integer");
  return checked_assistant_tokens(j[key].get<int64_t>(), path);
}

std::optional<int64_t> read_num_assistant_tokens(const GgufMetadata& m) {
  if (!m.find(kNumAssistantTokens)) return std::nullopt;
  return checked_assistant_tokens(m.get_int(kNumAssistantTokens), kNumAssistantTokens);
}

void write_num_assistant_tokens(int64_t tokens, GgufMetadata& m) { m.set(kNumAssistantTokens, GgufValue(uint32_t(tokens))); }

GenerationDefaults read_generation_defaults(const GgufMetadata& m) {
  GenerationDefaults d;
  const std::string legacy_temperature = std::string(kLegacyPrefix) + "temperature",
                    legacy_top_k = std::string(kLegacyPrefix) + "top_k",
                    legacy_top_p = std::string(kLegacyPrefix) + "top_p",
                    legacy_min_p = std::string(kLegacyPrefix) + "min_p";
  if (const char* k = key_of_default(m, kTemperature, legacy_temperature)) d.temperature = float(m.get_float(k));
  if (const char* k = key_of_default(m, kTopK, legacy_top_k)) d.top_k = int32_t(m.get_int(k));
  if (const char* k = key_of_default(m, kTopP, legacy_top_p)) d.top_p = float(m.get_float(k));
  if (const char* k = key_of_default(m, kMinP, legacy_min_p)) d.min_p = float(m.get_float(k));
  return d;
}

}  // namespace g4
