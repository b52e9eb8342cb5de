// A checkpoint's generation_config.json becomes the model file's sampling defaults (llama.cpp's
// general.sampling.* keys), which g4 run uses for the sampling flags the user does not give.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/hf_checkpoint.h"
#include "model/generation_config.h"
#include "model/gguf_export.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;

std::string checkpoint_with(const std::string& name, const std::string& generation_config) {
  const std::string dir = test::temp_dir(name);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(test::fixture_dir("tiny-31b-style") + "/" + f, dir + "/" + f);
  if (!generation_config.empty()) std::ofstream(dir + "/generation_config.json") << generation_config;
  return dir;
}

TEST(GenerationConfig, ReadFromCheckpoint) {
  const auto d = read_generation_config(
      checkpoint_with("gen_read", R"({"do_sample": true, "temperature": 1.0, "top_k": 64, "top_p": 0.95})"));
  EXPECT_EQ(d.temperature, 1.0f);
  EXPECT_EQ(d.top_k, 64);
  EXPECT_EQ(d.top_p, 0.95f);
  EXPECT_FALSE(d.min_p.has_value());
  EXPECT_FALSE(read_generation_config(checkpoint_with("gen_absent", "")).temperature.has_value());
  EXPECT_EQ(read_generation_config(checkpoint_with("gen_greedy", R"({"do_sample": false, "temperature": 0.9})")).temperature,
            0.0f);
  EXPECT_THROW(read_generation_config(checkpoint_with("gen_bad", R"({"top_k": )")), Error);
  EXPECT_THROW(read_generation_config(checkpoint_with("gen_type", R"({"top_k": "many"})")), Error);
}

TEST(GenerationConfig, ExportedAndUsedByRun) {
  const std::string dir = checkpoint_with("gen_export", R"({"do_sample": true, "temperature": 0.0, "top_k": 7})");
  const std::string out = test::temp_dir("gen_export_out") + "/m.gguf";
  ExportOptions o;
  o.use_sampling = true;
  export_gguf(HfCheckpoint(dir), out, o);
  GgufModel file(out);
  const auto d = read_generation_defaults(file.file().metadata());
  EXPECT_EQ(d.temperature, 0.0f);
  EXPECT_EQ(d.top_k, 7);

  // The file says greedy: without --temperature every seed gives the greedy tokens; with it, not.
  auto ids = [&](const std::string& args) {
    std::string output;
    EXPECT_EQ(test::run_command(std::string(G4_BINARY) + " run --model_path " + out +
                                    " --prompt_tokens 5,6,7 --print_token_ids --max_new_tokens 12 " + args + " 2>/dev/null",
                                &output), 0) << output;
    return output.substr(0, output.find('\n'));
  };
  EXPECT_EQ(ids("--seed 1"), ids("--seed 2"));
  EXPECT_EQ(ids("--seed 1"), ids("--temperature 0 --seed 3"));
  EXPECT_NE(ids("--seed 1 --temperature 2 --top_k 0"), ids("--seed 2 --temperature 2 --top_k 0"));
}

TEST(GenerationConfig, FileKeysAreLlamaCppsAndEarlierG4Files) {
  GenerationDefaults d;
  d.temperature = 0.5f;
  d.top_k = 40;
  d.min_p = 0.05f;
  GgufMetadata written;
  write_generation_defaults(d, written);
  // llama.cpp's converter and common/ use these keys and types (f32, i32).
  EXPECT_EQ(written.get_float("general.sampling.temp"), 0.5);
  EXPECT_EQ(written.get("general.sampling.top_k").type(), GgufType::I32);
  EXPECT_FALSE(written.find("general.sampling.top_p"));
  const auto back = read_generation_defaults(written);
  EXPECT_EQ(back.temperature, 0.5f);
  EXPECT_EQ(back.top_k, 40);
  EXPECT_FALSE(back.top_p.has_value());
  EXPECT_EQ(back.min_p, 0.05f);

  GgufMetadata legacy;  // a file exported by an earlier g4
  legacy.set("g4.generation.top_p", GgufValue(0.9f));
  legacy.set("g4.generation.temperature", GgufValue(0.7f));
  legacy.set("general.sampling.temp", GgufValue(0.25f));  // llama.cpp's key wins where both exist
  const auto old = read_generation_defaults(legacy);
  EXPECT_EQ(old.top_p, 0.9f);
  EXPECT_EQ(old.temperature, 0.25f);
  legacy.set("general.sampling.top_k", GgufValue(std::string("many")));
  EXPECT_THROW(read_generation_defaults(legacy), Error);
}

}  // namespace
}  // namespace g4
