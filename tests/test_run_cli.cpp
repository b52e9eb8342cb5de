// g4 run through the command line: SPEC §2's validation table row by row (clear message,
// non-zero exit, nothing generated), the seed flag, and reproducible output.
#include <gtest/gtest.h>

#include <filesystem>

#include "format/hf_checkpoint.h"
#include "model/gguf_export.h"
#include "support/fixtures.h"

namespace g4 {
namespace {

std::string model_file() {
  return test::shared_artifact("run-cli-sample.gguf", [](const std::string& path) {
    ExportOptions o;
    o.use_sampling = true;
    export_gguf(HfCheckpoint(test::fixture_dir("tiny-31b-style")), path, o);
  });
}

struct Outcome {
  int status;
  std::string output;
};

Outcome run_g4(const std::string& args) {
  Outcome o;
  o.status = test::run_command(std::string(G4_BINARY) + " run --model_path " + model_file() +
                                   " --print_token_ids --max_new_tokens 8 " + args, &o.output);
  return o;
}

void expect_rejected(const std::string& args, const std::string& message) {
  Outcome o = run_g4(args);
  EXPECT_NE(o.status, 0) << args << "\n" << o.output;
  EXPECT_NE(o.output.find(message), std::string::npos) << args << "\n" << o.output;
  EXPECT_EQ(o.output.find("--- report ---"), std::string::npos) << "nothing may be generated: " << args;
}

TEST(RunCli, TemperatureRange) {
  expect_rejected("--prompt_tokens 1,2 --temperature 2.5", "temperature must be in [0, 2] or -1");
  expect_rejected("--prompt_tokens 1,2 --temperature -0.5", "temperature must be in [0, 2] or -1");
  expect_rejected("--prompt_tokens 1,2 --temperature nan", "temperature");
  expect_rejected("--prompt_tokens 1,2 --temperature inf", "temperature");
  EXPECT_EQ(run_g4("--prompt_tokens 1,2 --temperature -1 --seed 1").status, 0);
}

TEST(RunCli, TopPRange) {
  expect_rejected("--prompt_tokens 1,2 --top_p 0", "top_p must be in (0, 1]");
  expect_rejected("--prompt_tokens 1,2 --top_p 1.5", "top_p must be in (0, 1]");
  expect_rejected("--prompt_tokens 1,2 --top_p nan", "top_p");
}

TEST(RunCli, TopKRange) {
  expect_rejected("--prompt_tokens 1,2 --top_k -1", "top_k must be >= 0");
  Outcome o = run_g4("--prompt_tokens 1,2 --top_k 100000 --seed 3");  // > vocab: clipped
  EXPECT_EQ(o.status, 0) << o.output;
}

TEST(RunCli, MinPRange) {
  expect_rejected("--prompt_tokens 1,2 --min_p 1", "min_p must be in [0, 1)");
  expect_rejected("--prompt_tokens 1,2 --min_p -0.1", "min_p must be in [0, 1)");
  expect_rejected("--prompt_tokens 1,2 --min_p inf", "min_p");
}

TEST(RunCli, Seed) {
  Outcome random = run_g4("--prompt_tokens 1,2");
  EXPECT_EQ(random.status, 0) << random.output;
  EXPECT_NE(random.output.find("Sampling base seed: "), std::string::npos) << random.output;
  expect_rejected("--prompt_tokens 1,2 --seed abc", "--seed must be -1 (random) or an integer");
  expect_rejected("--prompt_tokens 1,2 --seed -2", "--seed must be -1 (random) or an integer");
  expect_rejected("--prompt_tokens 1,2 --seed 18446744073709551616", "--seed must be -1 (random) or an integer");
  EXPECT_EQ(run_g4("--prompt_tokens 1,2 --seed 18446744073709551615").status, 0) << "any uint64 is a seed";
}

TEST(RunCli, TokenIdsAndContext) {
  expect_rejected("--prompt_tokens 1,512", "token id 512");
  expect_rejected("--prompt_tokens 1,-3", "token id -3");
  expect_rejected("--prompt_tokens 1,2,3,4,5,6,7,8,9,10 --max_seq_len 8", "context full (8 tokens)");
}

TEST(RunCli, SameSeedSameTokens) {
  Outcome a = run_g4("--prompt_tokens 5,6,7 --seed 42 --temperature 1 --top_k 50 --top_p 0.9");
  Outcome b = run_g4("--prompt_tokens 5,6,7 --seed 42 --temperature 1 --top_k 50 --top_p 0.9");
  ASSERT_EQ(a.status, 0) << a.output;
  auto ids = [](const std::string& out) { return out.substr(0, out.find('\n')); };
  EXPECT_EQ(ids(a.output), ids(b.output));
  EXPECT_NE(a.output.find("decode:"), std::string::npos) << "the end-of-run report";
  EXPECT_NE(a.output.find("time to first token:"), std::string::npos);
  EXPECT_NE(a.output.find("peak host memory:"), std::string::npos);
  EXPECT_NE(a.output.find("peak cpu backend memory:"), std::string::npos);
}

TEST(RunCli, MissingModelAndTokenizer) {
  Outcome o;
  o.status = test::run_command(std::string(G4_BINARY) + " run --model_path /nonexistent.gguf --prompt hi", &o.output);
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.output.find("does not exist"), std::string::npos) << o.output;
  o = run_g4("--prompt hello");  // the fixture has no tokenizer
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.output.find("no tokenizer"), std::string::npos) << o.output;
}

}  // namespace
}  // namespace g4
