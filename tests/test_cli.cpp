// The g4 binary as a new user meets it: --version, a mistyped command, g4 logits with its
// defaults, and g4 tokenize / detokenize with a model's own tokenizer.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/gguf_model.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"

namespace g4 {
namespace {

// The embedded demo's file; the logits tests use the fortune demo, whose vocabulary, window and
// context their numbers are (support/demo_engine.h).
const std::string kDemo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";

// Only what a command writes on stdout.
test::CommandResult stdout_of(const std::string& arguments) {
  test::CommandResult r;
  r.exit_code = test::run_command("( " + std::string(G4_BINARY) + " " + arguments + " 2>/dev/null )", &r.output);
  return r;
}

// A quantized export: inspect shows each type's share and the bits per weight; run says which
// types it loads and their bytes as the backend holds them.
TEST(Cli, QuantizedFilesShowTheirTypes) {
  const std::string path = test::temp_dir("cli_q4_k") + "/demo-q4_k.gguf";
  const test::CommandResult exported = test::run_g4("export --model-dir '" + std::string(G4_FIXTURES_DIR) +
                                                    "/demo/hf' --output '" + path + "' --weights q4_k");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const test::CommandResult inspected = test::run_g4("inspect '" + path + "'");
  ASSERT_EQ(inspected.exit_code, 0) << inspected.output;
  const auto j = nlohmann::json::parse(inspected.output);
  EXPECT_EQ(j["types"]["Q4_K"]["tensors"], 41);
  EXPECT_EQ(j["types"]["Q8_0"]["tensors"], 1);  // the embedding keeps 8 bits
  EXPECT_GT(j["bits_per_weight"].get<double>(), 4.5);
  EXPECT_LT(j["bits_per_weight"].get<double>(), 6.0);
  const test::CommandResult run = test::run_g4("run -m '" + path + "' -p hi -n 4 --temperature 0");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("weights: F32 x44, Q4_K x41, Q8_0 x1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("weight bytes by type on the cpu backend: F32 0.03 MiB, Q8_0 1.06 MiB, Q4_K 2.58 MiB"),
            std::string::npos)
      << run.output;
}

TEST(Cli, Version) {
  const test::CommandResult r = test::run_g4("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("g4 ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("backends: cpu"), std::string::npos) << r.output;
}

TEST(Cli, UnknownCommandListsTheCommands) {
  const test::CommandResult r = test::run_g4("chatt --prompt hi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown command 'chatt'"), std::string::npos) << r.output;
  for (const char* command : {"run", "chat", "logits", "export", "tokenize"})
    EXPECT_NE(r.output.find(std::string("\n  ") + command + " "), std::string::npos) << command << "\n" << r.output;
}

TEST(Cli, LogitsDefaultContextFitsTheModel) {
  // Three tokens: the default context used to be 4, below the demo model's sliding window (64).
  const std::string out = test::temp_dir("logits_default") + "/logits.f32";
  test::CommandResult r = test::run_g4("logits --model_path " + test::fortune_demo_path() + " --tokens 2,5,7 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(std::filesystem::file_size(out), 3u * 4096u * sizeof(float));
  r = test::run_g4("logits --model_path " + test::fixture_dir("tiny-31b-style") + " --tokens 2,5,7 --out " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Cli, LogitsContextOutsideTheModelsLimits) {
  const std::string out = test::temp_dir("logits_limits") + "/logits.f32";
  const std::string base = "logits -m " + test::fortune_demo_path() + " --tokens 2,5,7 --out " + out;
  test::CommandResult r = test::run_g4(base + " --max_seq_len 10");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("max_seq_len 10 is below what the model needs: at least 64 (the sliding window)"),
            std::string::npos)
      << r.output;
  r = test::run_g4(base + " --max_seq_len 5000");  // was silently clamped to 1024
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("max_seq_len 5000 exceeds the model's context length 1024"), std::string::npos) << r.output;
  r = test::run_g4(base + " --max_seq_len -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--max_seq_len must be"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing written after a rejected flag";
}

TEST(Cli, TokenizeWithTheModelsTokenizer) {
  // The same tokenizer three ways: the model file's, a tokenizer.json holding it, the default.
  const std::string json_path = test::temp_dir("tokenize_model") + "/tokenizer.json";
  {
    const GgufModel demo(kDemo);
    ASSERT_TRUE(demo.tokenizer_json().has_value());
    std::ofstream(json_path, std::ios::binary) << *demo.tokenizer_json();
  }
  const test::CommandResult from_json = stdout_of("tokenize --tokenizer_path " + json_path + " --text 'A fortune.'");
  const test::CommandResult from_model = stdout_of("tokenize --model_path " + kDemo + " --text 'A fortune.'");
  const test::CommandResult from_default = stdout_of("tokenize --text 'A fortune.'");
  ASSERT_EQ(from_model.exit_code, 0);
  EXPECT_EQ(from_model.output.front(), '[') << from_model.output;
  EXPECT_EQ(from_json.output, from_model.output);
  EXPECT_EQ(from_default.output, from_model.output);
  std::string stdin_ids;
  ASSERT_EQ(test::run_command("( printf 'A fortune.' | " + std::string(G4_BINARY) + " tokenize -m " + kDemo +
                                  " --text_file - 2>/dev/null )",
                              &stdin_ids),
            0);
  EXPECT_EQ(stdin_ids, from_model.output) << "--text_file - reads standard input";

  std::string ids = from_model.output.substr(1, from_model.output.find(']') - 1);
  const test::CommandResult text = stdout_of("detokenize -m " + kDemo + " --ids " + ids);
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_EQ(text.output, "A fortune.");
  const test::CommandResult both =
      test::run_g4("tokenize --tokenizer_path " + json_path + " --model_path " + kDemo + " --text x");
  EXPECT_NE(both.exit_code, 0) << "one tokenizer source at a time";
}

TEST(Cli, TokenizeAModelWithoutATokenizer) {
  const test::CommandResult r =
      test::run_g4("tokenize --model_path " + test::fixture_dir("tiny-31b-style") + " --text hi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("has no tokenizer"), std::string::npos) << r.output;
}

// g4 bench --concurrency runs every sequence to its end through the scheduler (any backend; the
// figures that matter come from the GPU machine, docs/PERF.md).
TEST(Cli, BenchConcurrencyRunsEverySequence) {
  const std::string demo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
  const test::CommandResult r =
      test::run_g4("bench --model_path '" + demo + "' --backend cpu --concurrency 1,3 --prompt_len 8 --gen 4 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const auto& run : j["runs"]) {
    EXPECT_EQ(run["generated_tokens"].get<int64_t>(), 4 * run["concurrency"].get<int64_t>());
    EXPECT_GT(run["aggregate_tok_s"].get<double>(), 0);
    EXPECT_LE(run["ttft_p50_s"].get<double>(), run["ttft_p99_s"].get<double>());
    // On the CPU a step is one forward for every sequence: after the first token, every step is a
    // full decode step (gen 4: three of them).
    EXPECT_EQ(run["full_decode_steps"].get<int64_t>(), 3) << run.dump();
    EXPECT_GT(run["full_decode_tok_s"].get<double>(), 0);
    // The KV pages: every sequence ran at once, each holding its pages, none preempted.
    EXPECT_EQ(run["most_running"].get<int64_t>(), run["concurrency"].get<int64_t>());
    EXPECT_EQ(run["preemptions"].get<int64_t>(), 0);
    EXPECT_GE(run["kv_most_pages_in_use"].get<int64_t>(), run["concurrency"].get<int64_t>());
    EXPECT_LE(run["kv_most_pages_in_use"].get<int64_t>(), run["kv_pages_total"].get<int64_t>());
    EXPECT_GT(run["kv_page_bytes"].get<int64_t>(), 0);
  }
  EXPECT_EQ(j["sampler_rows"].get<int64_t>(), 3);
  const test::CommandResult bad = test::run_g4("bench --model_path '" + demo + "' --backend cpu --concurrency 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("counts must be >= 1"), std::string::npos) << bad.output;
  // Prompts longer than a step's prefill: the first sequence ends before the third is admitted, so no
  // step decodes every sequence, and the report says why instead of a figure.
  const test::CommandResult short_run =
      test::run_g4("bench --model_path '" + demo + "' --backend cpu --concurrency 3 --prompt_len 300 --gen 2 2>/dev/null");
  ASSERT_EQ(short_run.exit_code, 0) << short_run.output;
  const nlohmann::json short_report = nlohmann::json::parse(short_run.output)["runs"][0];
  EXPECT_FALSE(short_report.contains("full_decode_step_ms")) << short_report.dump();
  EXPECT_NE(short_report.value("full_decode_missing", "").find("raise --gen"), std::string::npos) << short_report.dump();
  const test::CommandResult bad_profile =
      test::run_g4("bench --model_path '" + demo + "' --backend cpu --concurrency 1 --profile_steps -1");
  EXPECT_NE(bad_profile.exit_code, 0);
  EXPECT_NE(bad_profile.output.find("--profile_steps"), std::string::npos) << bad_profile.output;
}

// g4 bench --held: sequences holding copies of one long context, each its own pages, decoding
// together; the bench fails unless every copy's logits are the first sequence's bits. TQ4 full-layer
// caches hold the same sequences in fewer bytes than bf16.
TEST(Cli, BenchHeldDecodesCopiesOfOneContext) {
  const std::string demo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
  auto held = [&](const std::string& kv_type) {
    const test::CommandResult r = test::run_g4("bench --model_path '" + demo + "' --backend cpu --held 1,3 --prompt_len "
                                               "300 --gen 3 --kv_type " + kv_type + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
  };
  const nlohmann::json bf16 = held("bf16"), tq4 = held("tq4");
  for (const nlohmann::json& j : {bf16, tq4}) {
    ASSERT_TRUE(j.contains("runs")) << j.dump();
    ASSERT_EQ(j["runs"].size(), 2u) << j.dump();
    EXPECT_GE(j["sequences_that_fit"].get<int64_t>(), 3);
    for (const nlohmann::json& run : j["runs"]) {
      const int64_t n = run["held_sequences"].get<int64_t>();
      EXPECT_GT(run["decode_tok_s"].get<double>(), 0);
      // Every full layer holds each sequence's 300 positions.
      EXPECT_GE(run["kv_bytes_held"].get<int64_t>(), n * 300 * j["kv_bytes_per_token_full"].get<int64_t>());
    }
    EXPECT_EQ(j["runs"][1]["held_sequences"].get<int64_t>(), 3);
  }
  EXPECT_LT(tq4["runs"][1]["kv_bytes_held"].get<int64_t>(), bf16["runs"][1]["kv_bytes_held"].get<int64_t>());
  const test::CommandResult both =
      test::run_g4("bench --model_path '" + demo + "' --backend cpu --held 2 --concurrency 2");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("--held runs alone"), std::string::npos) << both.output;
  const test::CommandResult zero = test::run_g4("bench --model_path '" + demo + "' --backend cpu --held 0");
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.output.find("--held: counts must be >= 1"), std::string::npos) << zero.output;
}

// --kv_type and --kv_sliding_type on the commands that run the model: the caches they ask for (the
// report's bytes a token), and a clear error before anything loads for a type that does not exist.
// --draft_model on g4 run (the same greedy ids as without it, and the rounds reported) and g4
// bench (the drafted decode's figures); `--draft_model demo`, the assistant linked into g4 beside the
// demo; where it cannot run, a clear error.
TEST(Cli, DraftModelOnRunAndBench) {
  const std::string target = std::string(G4_FIXTURES_DIR) + "/demo/hf", assistant = std::string(G4_FIXTURES_DIR) + "/assistant/hf";
  const std::string run = "run -m '" + target + "' --prompt_tokens 2,105,738,611 --temperature 0 -n 12 --print_token_ids";
  const test::CommandResult plain = test::run_g4(run + " 2>/dev/null");
  const test::CommandResult drafted = test::run_g4(run + " --draft_model '" + assistant + "' --draft_tokens 3 2>&1");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(drafted.exit_code, 0) << drafted.output;
  EXPECT_EQ(drafted.output.substr(0, drafted.output.find('\n')), plain.output.substr(0, plain.output.find('\n')));
  EXPECT_NE(drafted.output.find("drafting: 3 tokens a round;"), std::string::npos) << drafted.output;

  const test::CommandResult bench = test::run_g4("bench --backend cpu --model_path '" + target +
                                                 "' --prompt_len 20 --gen 8 --draft_model '" + assistant + "' 2>/dev/null");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  const nlohmann::json j = nlohmann::json::parse(bench.output);
  EXPECT_GT(j["drafted_decode_greedy_tok_s"].get<double>(), 0);
  EXPECT_GT(j["draft_rounds"].get<int64_t>(), 0);
  EXPECT_EQ(j["draft_tokens"].get<int64_t>(), 4);

  // --draft_accept: the rounds keep the chosen drafts of the target's own greedy text (the CPU's
  // verify gives those tokens bit for bit), 1.5 a round on average, whatever the random assistant drafts.
  const test::CommandResult forced =
      test::run_g4("bench --backend cpu --model_path '" + target + "' --prompt_len 20 --gen 25 --draft_model '" +
                   assistant + "' --draft_tokens 3 --draft_accept 1.5 2>/dev/null");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  const nlohmann::json f = nlohmann::json::parse(forced.output);
  EXPECT_EQ(f["draft_rounds"].get<int64_t>(), 10) << f.dump();  // 24 tokens after the first, 2.5 a round
  EXPECT_DOUBLE_EQ(f["draft_tokens_per_round"].get<double>(), 2.4) << f.dump();  // the last round cut by -n
  // The sampled run's rounds are its own (not added to the greedy run's): they give its 24 tokens
  // after the first, but for a last one drawn by a plain step when a round could hold no draft.
  EXPECT_GT(f["drafted_decode_topk_topp_tok_s"].get<double>(), 0);
  const double sampled_round_tokens =
      f["draft_rounds_topk_topp"].get<double>() * f["draft_tokens_per_round_topk_topp"].get<double>();
  EXPECT_TRUE(std::abs(sampled_round_tokens - 23.0) < 1e-9 || std::abs(sampled_round_tokens - 24.0) < 1e-9) << f.dump();

  // --concurrency with --draft_model: the sequences decode in rounds through the scheduler.
  const test::CommandResult batched =
      test::run_g4("bench --backend cpu --model_path '" + target + "' --concurrency 3 --prompt_len 10 --gen 16 --draft_model '" +
                   assistant + "' --draft_tokens 2 2>/dev/null");
  ASSERT_EQ(batched.exit_code, 0) << batched.output;
  const nlohmann::json b = nlohmann::json::parse(batched.output)["runs"][0];
  EXPECT_EQ(b["generated_tokens"].get<int64_t>(), 48) << b.dump();
  EXPECT_GT(b["draft_rounds"].get<int64_t>(), 0) << b.dump();

  // The embedded pair, from the binary alone: the demo's greedy text, its rounds reported.
  const std::string demo_run = "run --prompt 'What is the capital of Italy?' --temperature 0 -n 24 --print_token_ids";
  const test::CommandResult demo_plain = test::run_g4(demo_run + " 2>/dev/null");
  const test::CommandResult demo_drafted = test::run_g4(demo_run + " --draft_model demo 2>&1");
  ASSERT_EQ(demo_drafted.exit_code, 0) << demo_drafted.output;
  EXPECT_EQ(demo_drafted.output.substr(0, demo_drafted.output.find('\n')),
            demo_plain.output.substr(0, demo_plain.output.find('\n')));
  EXPECT_NE(demo_drafted.output.find("drafting: 4 tokens a round;"), std::string::npos) << demo_drafted.output;

  for (const auto& [command, message] : std::vector<std::pair<std::string, std::string>>{
           {"bench --backend cpu --synthetic 31b --draft_model '" + assistant + "'", "--draft_model synthetic goes with"},
           {"bench --backend cpu --synthetic 31b --draft_model demo", "a file or demo with --model_path"},
           {run + " --draft_model demo", "does not belong"},
           {"bench --backend cpu --model_path '" + target + "' --prompt_len 20 --gen 8 --draft_model '" + assistant + "' --draft_tokens 2 --draft_accept 3",
            "exceeds the 2 drafts a round"},
           {run + " --draft_model '" + assistant + "' --draft_tokens 17", "--draft_tokens must be in [1, 16]"},
           {run + " --draft_model '" + target + "'", "num_kv_shared_layers"},
           {"run --prompt hi -n 2 --draft_model '" + assistant + "'", "does not belong"},
           {"serve --draft_model '" + assistant + "'", "does not belong"}}) {
    const test::CommandResult r = test::run_g4(command + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_NE(r.output.find(message), std::string::npos) << command << "\n" << r.output;
  }
}

// --ignore_eos: the demo's short reply ends at <turn|> without it; with it every -n token comes.
TEST(Cli, IgnoreEosGeneratesEveryToken) {
  const std::string run = "run --prompt 'Hello! Who are you?' --temperature 0 -n 40 --print_token_ids";
  const test::CommandResult stopped = test::run_g4(run + " 2>&1"), full = test::run_g4(run + " --ignore_eos 2>&1");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_NE(stopped.output.find("(stopped at a stop token)"), std::string::npos) << stopped.output;
  EXPECT_NE(full.output.find("generated tokens: 40\n"), std::string::npos) << full.output;
  const std::string reply = stopped.output.substr(0, stopped.output.find('\n'));
  EXPECT_EQ(full.output.substr(0, reply.size()), reply);  // the same reply, then more
}

TEST(Cli, KvTypesOnEveryCommand) {
  const std::string demo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
  const std::string quantized = " --kv_type tq4 --kv_sliding_type q8_0";
  // The demo: two full layers of one 128-dim head (a TQ4 row: 64 code bytes and a norm, padded to
  // 80), six sliding layers of two 64-dim heads (a Q8_0 row: four blocks of 34 bytes); K and V.
  const test::CommandResult run = test::run_g4("run --prompt 'Tell me a fortune.' -n 4" + quantized);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("KV caches: full layers tq4, 320 bytes a token; sliding layers q8_0, 1632 bytes a token"),
            std::string::npos)
      << run.output;
  const test::CommandResult bench = test::run_g4("bench --model_path '" + demo +
                                                 "' --backend cpu --concurrency 2 --prompt_len 8 --gen 3" + quantized +
                                                 " 2>/dev/null");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  const nlohmann::json runs = nlohmann::json::parse(bench.output)["runs"];
  EXPECT_EQ(runs[0]["kv_bytes_per_token_full"].get<int64_t>(), 320) << runs.dump();
  EXPECT_EQ(runs[0]["kv_bytes_per_token_sliding"].get<int64_t>(), 1632) << runs.dump();
  const test::CommandResult inspect = test::run_g4("inspect '" + demo + "' 2>/dev/null");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  const nlohmann::json kv = nlohmann::json::parse(inspect.output)["kv_bytes_per_token"];
  EXPECT_EQ(kv["tq4/q8_0"]["full"].get<int64_t>(), 320) << kv.dump();
  EXPECT_EQ(kv["bf16/bf16"]["sliding"].get<int64_t>(), 6 * 2 * 2 * 64 * 2) << kv.dump();
  const std::string out = test::temp_dir("kv-types-cli") + "/logits.bin";
  const test::CommandResult logits =
      test::run_g4("logits --model_path '" + demo + "' --tokens 2,818,5067,2201 --out " + out + quantized);
  EXPECT_EQ(logits.exit_code, 0) << logits.output;
  const std::vector<std::string> commands = {"run --prompt x", "chat", "serve",
                                             "logits --model_path '" + demo + "' --tokens 2 --out " + out,
                                             "bench --model_path '" + demo + "' --backend cpu --concurrency 1",
                                             "perplexity -m '" + demo + "' -f /dev/null"};
  for (const std::string& command : commands) {
    const test::CommandResult bad = test::run_g4(command + " --kv_type q4_0");
    EXPECT_NE(bad.exit_code, 0) << command;
    EXPECT_NE(bad.output.find("--kv_type must be bf16, q8_0 or tq4, not 'q4_0'"), std::string::npos)
        << command << ": " << bad.output;
  }
  const test::CommandResult sliding = test::run_g4("run --prompt x --kv_sliding_type tq4");
  EXPECT_NE(sliding.exit_code, 0);
  EXPECT_NE(sliding.output.find("tq4 is for the full-attention layers"), std::string::npos) << sliding.output;
}

// g4 export --kv_type records the caches in the file: runs of it take them unless their flags
// choose others; files without them (the embedded demo, llama.cpp's) run bf16 caches.
TEST(Cli, ExportedKvTypesAreTheFilesDefault) {
  const std::string dir = test::temp_dir("kv-types-export");
  const std::string file = dir + "/demo-tq4.gguf", checkpoint = std::string(G4_SOURCE_DIR) + "/tests/fixtures/demo/hf";
  const test::CommandResult exported = test::run_g4("export --model-dir " + checkpoint + " --output " + file + " --kv_type tq4 --kv_sliding_type q8_0 2>&1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("KV caches tq4 full, q8_0 sliding"), std::string::npos) << exported.output;
  const std::string run = "run --model_path " + file + " --prompt 'Tell me a fortune.' -n 4";
  const test::CommandResult by_default = test::run_g4(run + " 2>&1"), chosen = test::run_g4(run + " --kv_type bf16 2>&1");
  ASSERT_EQ(by_default.exit_code, 0) << by_default.output;
  EXPECT_NE(by_default.output.find("KV caches: full layers tq4, "), std::string::npos) << by_default.output;
  EXPECT_NE(by_default.output.find("; sliding layers q8_0, "), std::string::npos)
      << by_default.output;
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("KV caches: full layers bf16, "), std::string::npos) << chosen.output;
  EXPECT_NE(chosen.output.find("; sliding layers q8_0, "), std::string::npos)
      << chosen.output;
  const test::CommandResult bench =
      test::run_g4("bench --model_path " + file + " --backend cpu --concurrency 1 --prompt_len 4 --gen 2 2>/dev/null");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_EQ(nlohmann::json::parse(bench.output)["runs"][0]["kv_type"], "tq4") << bench.output;
  const test::CommandResult inspect = test::run_g4("inspect " + file + " 2>/dev/null");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  const nlohmann::json j = nlohmann::json::parse(inspect.output);
  EXPECT_EQ(j["kv_types_by_default"]["full"], "tq4") << inspect.output;
  EXPECT_EQ(j["metadata"]["g4.kv_sliding_type"], "q8_0") << inspect.output;
  const test::CommandResult plain = test::run_g4("inspect " + std::string(G4_SOURCE_DIR) + "/models/demo.gguf 2>/dev/null");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(nlohmann::json::parse(plain.output)["kv_types_by_default"]["full"], "bf16");
  const test::CommandResult bad = test::run_g4("export --model-dir " + checkpoint + " --output " + dir + "/bad.gguf --kv_sliding_type tq4 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("tq4 is for the full-attention layers"), std::string::npos) << bad.output;
}

// g4 bench --suite: prompt processing and decode at each length, cut to the model's context
// (the demo's 2 048 positions), from one load.
TEST(Cli, BenchSuiteReportsEveryLength) {
  const std::string demo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
  const test::CommandResult r = test::run_g4("bench --model_path '" + demo +
                                             "' --backend cpu --suite --suite_prompts 16,48 "
                                             "--suite_contexts 32,99999 --gen 4 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  for (const char* n : {"16", "48"}) EXPECT_GT(j["prefill_tok_s"].value(n, 0.0), 0) << n << " in " << r.output;
  for (const char* n : {"32", "2036"}) EXPECT_GT(j["decode_greedy_tok_s"].value(n, 0.0), 0) << n << " in " << r.output;
  EXPECT_GT(j["achieved_tb_s"].get<double>(), 0);
  const test::CommandResult bad = test::run_g4("bench --model_path '" + demo + "' --backend cpu --suite --suite_prompts 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--suite lengths must be >= 1"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace g4
