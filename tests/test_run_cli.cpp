// g4 run through the command line: the validation table of the sampling parameters row by row
// (clear message, non-zero exit, nothing generated), the other flags' checks, the seed flag,
// and reproducible output.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "model/hf_checkpoint.h"
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

// As expect_rejected, and the error is all there is: no token, no seed line before it.
void expect_rejected_at_once(const std::string& args, const std::string& message) {
  expect_rejected(args, message);
  Outcome o = run_g4(args);
  EXPECT_EQ(o.output.rfind("error: ", 0), 0u) << "printed before the error: " << args << "\n" << o.output;
}

// g4 with the demo model (it has a tokenizer and a generation config).
Outcome run_demo(const std::string& args) {
  Outcome o;
  o.status = test::run_command(std::string(G4_BINARY) + " " + args, &o.output);
  return o;
}

// Only what a command writes on stdout.
Outcome stdout_of(const std::string& command) {
  Outcome o;
  o.status = test::run_command("( " + command + " 2>/dev/null )", &o.output);
  return o;
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
  EXPECT_NE(a.output.find("sampling: temperature 1 (flag), top_k 50 (flag), top_p 0.9 (flag), min_p 0 (default), "
                          "seed 42"),
            std::string::npos)
      << "the report names the sampling settings in effect\n"
      << a.output;
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

TEST(RunCli, ReportShowsTheModelsSamplingDefaults) {
  // The demo model's generation config: temperature 0.7, top_k 40, top_p 0.9.
  Outcome o = run_demo("run --prompt hi --max_new_tokens 2 --seed 7 --top_k 5");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("sampling: temperature 0.7 (model), top_k 5 (flag), top_p 0.9 (model), min_p 0 (default), "
                          "seed 7"),
            std::string::npos)
      << o.output;
  o = run_demo("run --prompt hi --max_new_tokens 2 --temperature 0");
  EXPECT_NE(o.output.find("sampling: greedy (temperature 0, flag)"), std::string::npos) << o.output;
}

TEST(RunCli, SeedLineOnlyForARunThatSamples) {
  Outcome greedy = run_g4("--prompt_tokens 1,2 --temperature 0");
  EXPECT_EQ(greedy.status, 0) << greedy.output;
  EXPECT_EQ(greedy.output.find("Sampling base seed"), std::string::npos) << "greedy draws nothing\n" << greedy.output;
  Outcome missing;
  test::run_command(std::string(G4_BINARY) + " run --model_path /nonexistent.gguf --prompt hi", &missing.output);
  EXPECT_EQ(missing.output.rfind("error: ", 0), 0u) << "no seed line before a load error\n" << missing.output;
  expect_rejected_at_once("--prompt hi", "no tokenizer");  // the fixture has none
  expect_rejected_at_once("--prompt_tokens 1,999", "token id 999");
}

TEST(RunCli, OnePromptSource) {
  expect_rejected_at_once("--prompt hi --prompt_tokens 1,2", "give one of --prompt, --prompt_file and --prompt_tokens");
  expect_rejected_at_once("--prompt_file " + test::temp_dir("prompt_dir") + " --prompt_tokens 1,2",
                          "give one of --prompt, --prompt_file and --prompt_tokens");
  expect_rejected_at_once("", "no prompt: give --prompt, --prompt_file or --prompt_tokens");
  expect_rejected_at_once("--prompt_tokens ''", "--prompt_tokens is empty");
  Outcome o = run_demo("run --prompt_file " + test::temp_dir("prompt_dir") + " --max_new_tokens 2");
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("it is a directory"), std::string::npos) << o.output;
}

TEST(RunCli, PromptFromStandardInput) {
  const std::string flags = " --max_new_tokens 6 --temperature 0";
  Outcome piped = stdout_of("printf 'Tell me a fortune.' | " + std::string(G4_BINARY) + " run --prompt_file -" + flags);
  Outcome given = stdout_of(std::string(G4_BINARY) + " run --prompt 'Tell me a fortune.'" + flags);
  ASSERT_EQ(piped.status, 0) << piped.output;
  EXPECT_FALSE(given.output.empty());
  EXPECT_EQ(piped.output, given.output);
}

TEST(RunCli, FlagRanges) {
  expect_rejected_at_once("--prompt_tokens 1,2 --eos_id -5", "--eos_id must be a token id (>= 0), got -5");
  expect_rejected_at_once("--prompt_tokens 1,2 --bos_id -1", "--bos_id must be a token id (>= 0), got -1");
  expect_rejected_at_once("--prompt_tokens 1,2 --eos_id 512", "--eos_id 512 is outside the model's vocabulary [0, 512)");
  expect_rejected_at_once("--prompt_tokens 1,2 --max_seq_len -1", "--max_seq_len must be");
  Outcome negative = run_demo("run --prompt hi --max_new_tokens -1");  // run_g4 gives its own count
  EXPECT_NE(negative.status, 0);
  EXPECT_EQ(negative.output.rfind("error: --max_new_tokens must be >= 0", 0), 0u) << negative.output;
  expect_rejected_at_once("--prompt_tokens 1,2 --threads -2", "--threads must be >= 0");
  // Found before the model loads, not after the first token is printed.
  expect_rejected_at_once("--prompt_tokens 1,2 --cuda_graph", "--cuda_graph needs --backend cuda");
  expect_rejected_at_once("--prompt_tokens 1,2 --frequency_penalty 3", "frequency_penalty must be in [-2, 2], got 3");
  expect_rejected_at_once("--prompt_tokens 1,2 --repetition_penalty 0", "repetition_penalty must be in (0, 2], got 0");
  expect_rejected_at_once("--prompt_tokens 1,2 --logit_bias 5=1", "--logit_bias takes ID:BIAS pairs separated by commas, got '5=1'");
  expect_rejected_at_once("--prompt_tokens 1,2 --logit_bias 5:101", "a logit_bias value must be in [-100, 100], got 101");
  expect_rejected_at_once("--prompt_tokens 1,2 --logit_bias 512:1", "logit_bias names token 512, outside the vocabulary [0, 512)");
}

// --logit_bias and the penalties reach the draws: a +100 bias makes its token the greedy choice;
// this model repeats its greedy token, and the penalties make it move on.
TEST(RunCli, LogitBiasAndPenaltiesChangeTheTokens) {
  const std::string base = std::string(G4_BINARY) + " run --model_path " + model_file() +
                           " --prompt_tokens 1,2 --max_new_tokens 12 --temperature 0";
  const Outcome plain = stdout_of(base), forced = stdout_of(base + " --logit_bias 77:100");
  ASSERT_EQ(plain.status, 0) << plain.output;
  ASSERT_EQ(forced.status, 0) << forced.output;
  EXPECT_EQ(forced.output.rfind("77,77,77,77,", 0), 0u) << forced.output;
  const Outcome penalized = stdout_of(base + " --frequency_penalty 2 --presence_penalty 2");
  ASSERT_EQ(penalized.status, 0) << penalized.output;
  auto distinct = [](const std::string& ids) {
    std::set<std::string> seen;
    std::stringstream in(ids);
    for (std::string id; std::getline(in, id, ',');) seen.insert(id);
    return seen.size();
  };
  EXPECT_GT(distinct(penalized.output), distinct(plain.output) + 4) << plain.output << " / " << penalized.output;
}

TEST(RunCli, ContextSizeWithinTheModelsLimits) {
  // tiny-31b-style: sliding window 8, max_position_embeddings 256.
  expect_rejected_at_once("--prompt_tokens 1,2 --max_seq_len 4", "max_seq_len 4 is below what the model needs: at least 8");
  expect_rejected_at_once("--prompt_tokens 1,2 --max_seq_len 300",
                          "max_seq_len 300 exceeds the model's context length 256");
  EXPECT_EQ(run_g4("--prompt_tokens 1,2 --max_seq_len 8").status, 0);
  EXPECT_EQ(run_g4("--prompt_tokens 1,2 --max_seq_len 256").status, 0);
}

TEST(RunCli, WithoutATokenizerPrintsTheIds) {
  const std::string base = std::string(G4_BINARY) + " run --model_path " + model_file() +
                           " --prompt_tokens 1,2 --max_new_tokens 4 --temperature 0";
  Outcome plain = stdout_of(base);
  Outcome ids = stdout_of(base + " --print_token_ids");
  ASSERT_EQ(plain.status, 0);
  EXPECT_FALSE(plain.output.empty()) << "the ids are the output when there is no text";
  EXPECT_EQ(plain.output.find_first_not_of("0123456789,\n"), std::string::npos) << plain.output;
  EXPECT_EQ(plain.output, ids.output);
}

TEST(RunCli, ShortAliasesAndThreads) {
  const std::string model = model_file();
  Outcome long_form = stdout_of(std::string(G4_BINARY) + " run --model_path " + model +
                                " --prompt_tokens 5,6 --max_new_tokens 5 --seed 9 --temperature 1 --threads 1");
  Outcome short_form =
      stdout_of(std::string(G4_BINARY) + " run -m " + model + " --prompt_tokens 5,6 -n 5 -s 9 --temperature 1 -t 2");
  ASSERT_EQ(long_form.status, 0) << long_form.output;
  ASSERT_EQ(short_form.status, 0) << short_form.output;
  EXPECT_EQ(long_form.output, short_form.output) << "same tokens whatever the thread count";
  Outcome demo = stdout_of(std::string(G4_BINARY) + " run -p 'Tell me a fortune.' -n 4 --temperature 0");
  Outcome demo_long = stdout_of(std::string(G4_BINARY) + " run --prompt 'Tell me a fortune.' -n 4 --temperature 0");
  EXPECT_EQ(demo.output, demo_long.output);
  EXPECT_FALSE(demo.output.empty());
}

}  // namespace
}  // namespace g4
