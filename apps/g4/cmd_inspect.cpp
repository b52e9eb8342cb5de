// g4 inspect: a GGUF model file's metadata and tensor table as JSON.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "format/gguf.h"
#include "model/gguf_model.h"
#include "model/kv_types.h"
#include "util/error.h"

namespace g4::cli {

namespace {

using json = nlohmann::ordered_json;  // keeps the file's metadata order

// Long strings (an embedded tokenizer.json) and arrays (a vocabulary) are summarised unless --full.
constexpr size_t kShownStringBytes = 256;
constexpr size_t kShownArrayItems = 64;

json to_json(const GgufValue& value, bool full) {
  return std::visit(
      [&](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (full || x.size() <= kShownStringBytes) return x;
          return "<string of " + std::to_string(x.size()) + " bytes>";
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          if (!full && x.items.size() > kShownArrayItems)
            return "<array of " + std::to_string(x.items.size()) + " " + gguf_type_name(x.element_type) + ">";
          json items = json::array();
          for (const GgufValue& item : x.items) items.push_back(to_json(item, full));
          return items;
        } else {
          return x;
        }
      },
      value.storage());
}

bool is_gemma4(const GgufFile& file) {
  const GgufValue* arch = file.metadata().find("general.architecture");
  return arch && arch->type() == GgufType::STRING && arch->to_string("general.architecture") == "gemma4";
}

// What a position costs in the caches of each --kv_type (with --kv_sliding_type q8_0 where the
// full layers are quantized), by layer kind, K and V together, bf16 being the GPU's 2 bytes.
json kv_bytes_json(const ModelConfig& config) {
  json out = json::object();
  for (const KvTypes types : {KvTypes{}, KvTypes{KvType::kQ8_0, KvType::kQ8_0}, KvTypes{KvType::kTq4, KvType::kQ8_0}}) {
    const std::string name = kv_type_name(types.full) + "/" + kv_type_name(types.sliding);
    try {
      const KvBytesPerToken b = kv_bytes_per_token(config, layer_kv_dtypes(config, types, DType::BF16));
      out[name] = {{"full", b.full}, {"sliding", b.sliding}};
    } catch (const Error& e) {  // a head dim the type cannot hold
      out[name] = e.what();
    }
  }
  return out;
}

void run_inspect(const std::string& path, bool full) {
  const GgufFile file(path);
  json metadata = json::object();
  for (const auto& [key, value] : file.metadata().entries()) metadata[key] = to_json(value, full);
  json tensors = json::array();
  for (const GgufTensorInfo& t : file.tensors())
    tensors.push_back({{"name", t.name}, {"type", dtype_name(t.dtype)}, {"dims", t.dims}, {"offset", t.offset},
                       {"bytes", t.bytes}});
  const WeightTypes w = weight_types(file);
  json types = json::object();
  for (const auto& [type, use] : w.by_type)
    types[type] = {{"tensors", use.tensors}, {"weights", use.weights}, {"bytes", use.bytes}};
  json out = {{"file", path}, {"version", file.version()}, {"alignment", file.alignment()},
              {"data_offset", file.data_offset()}, {"bits_per_weight", w.bits_per_weight},
              {"types", types}};
  if (is_gemma4(file)) {
    const ModelConfig config = gemma4_config(file);
    out["kv_bytes_per_token"] = kv_bytes_json(config);
    // The caches runs take unless their flags choose (g4 export --kv_type; bf16 when not recorded).
    const KvTypes kv = program_flags(file.metadata(), config).kv_types;
    out["kv_types_by_default"] = {{"full", kv_type_name(kv.full)}, {"sliding", kv_type_name(kv.sliding)}};
  }
  out["metadata"] = metadata;
  out["tensors"] = tensors;
  std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto full = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "Print a GGUF model file's metadata and tensor table as JSON");
  cmd->add_option("file", *path, "The model file")->required();
  cmd->add_flag("--full", *full, "Print long strings and arrays in full");
  cmd->callback([path, full] { run_inspect(*path, *full); });
}

}  // namespace g4::cli
