// g4 run: generate text from a prompt.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "generation_flags.h"
#include "runtime/generator.h"
#include "runtime/tensor_parallel.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/progress.h"

namespace g4::cli {

namespace {

struct RunOptions {
  GenerationFlags gen;
  std::string prompt, prompt_file, prompt_tokens;
  CLI::Option *prompt_flag = nullptr, *prompt_file_flag = nullptr, *prompt_tokens_flag = nullptr;
  bool raw_prompt = false, print_token_ids = false, ignore_eos = false;
};

// Exactly one prompt source: a second one would silently lose the other.
void check_prompt_flags(const RunOptions& o) {
  const size_t given = o.prompt_flag->count() + o.prompt_file_flag->count() + o.prompt_tokens_flag->count();
  G4_CHECK(given == 1, (given == 0 ? "no prompt: give --prompt, --prompt_file or --prompt_tokens"
                                   : "give one of --prompt, --prompt_file and --prompt_tokens, not several"));
  G4_CHECK(!o.prompt_tokens_flag->count() || !o.prompt_tokens.empty(), "--prompt_tokens is empty: give ids such as 2,105");
}

// The prompt text, read once (standard input too) before any rank starts.
std::string prompt_text(const RunOptions& o) {
  if (o.prompt_tokens_flag->count()) return "";
  return o.prompt_file_flag->count() ? read_input(o.prompt_file) : o.prompt;
}

std::vector<int32_t> prompt_ids(const RunOptions& o, const std::string& text, const std::optional<Tokenizer>& tokenizer,
                                const Engine& engine) {
  if (o.prompt_tokens_flag->count()) return parse_id_list(o.prompt_tokens);
  G4_CHECK(tokenizer, "no tokenizer: the model has none embedded; pass --tokenizer_path or --prompt_tokens");
  if (!o.raw_prompt && engine.tp_rank() == 0) note_foreign_chat_template(engine);
  return encode_prompt(*tokenizer, text, o.raw_prompt, o.gen.bos_id);
}

void print_report(const std::vector<int32_t>& prompt, const GenerationResult& r, const ResolvedSampling& sampling,
                  const Engine& engine, const Session& session, const Backend& backend, const std::string& model_path) {
  const double prefill_tps = r.prefill_seconds > 0 ? double(prompt.size()) / r.prefill_seconds : 0;
  const double decode_tps =
      r.decode_seconds > 0 && r.tokens.size() > 1 ? double(r.tokens.size() - 1) / r.decode_seconds : 0;
  std::fprintf(stderr,
               "\n--- report ---\n%s\nprompt tokens: %zu\ngenerated tokens: %zu%s\ntime to first token: %.3f s\n"
               "prefill: %.1f tok/s\ndecode: %.1f tok/s\npeak host memory: %.1f MiB\npeak %s backend memory: %.1f MiB\n",
               describe_sampling(sampling).c_str(), prompt.size(), r.tokens.size(),
               r.stop_token >= 0 ? " (stopped at a stop token)" : r.context_full ? " (context full)" : "",
               r.prefill_seconds, prefill_tps, decode_tps, peak_host_mib(), backend.name().c_str(),
               double(backend.peak_memory_bytes()) / double(1 << 20));
  // Which weight types the model file holds (a checkpoint directory or the demo: its own dtype).
  if (std::filesystem::is_regular_file(model_path))
    std::fprintf(stderr, "weights: %s\n", weight_types(GgufFile(model_path)).summary().c_str());
  std::fprintf(stderr, "weight bytes by type on the %s backend: %s\n", backend.name().c_str(),
               describe_weight_bytes(weight_bytes_by_type(engine.model().weights())).c_str());
  std::fprintf(stderr, "%s\n", describe_kv_caches(engine.kv_pool()).c_str());
  if (const SpeculationStats* drafting = session.speculation_stats())
    std::fprintf(stderr, "%s\n", describe_drafting(*drafting, engine.draft_options().draft_tokens).c_str());
  if (engine.tp_size() > 1)
    std::fprintf(stderr, "tensor parallel: %d ranks (the memory and weight figures are rank 0's)\n", engine.tp_size());
}

// One rank's run (the only one unless --tp > 1): every rank generates the same tokens (docs/DESIGN.md,
// "Tensor parallel"); rank 0 prints them and the report.
void run_on(const RunOptions& o, const GenerationFlags& flags, const std::string& prompt, Engine& engine) {
  check_token_flags(flags, engine);
  const bool speaks = engine.tp_rank() == 0;
  const std::optional<Tokenizer> tokenizer = open_tokenizer(flags, engine);
  std::unique_ptr<Session> session = engine.create_session();
  GenerationRequest request;
  request.prompt = prompt_ids(o, prompt, tokenizer, engine);
  session->check_input(request.prompt, 0);
  // Only once nothing can fail any more: the random seed line belongs to a run that happens.
  const ResolvedSampling sampling = effective_sampling(flags, engine.generation_defaults(), speaks);
  request.sampler = sampling.sampler;
  request.max_new_tokens = flags.max_new_tokens;
  request.stop_ids = o.ignore_eos ? std::vector<int32_t>{} : stop_ids(flags, engine);
  request.graph = flags.cuda_graph;
  request.penalties = flag_penalties(flags);
  request.draft = engine.draft_options();

  // Without a tokenizer the ids are the only output there is.
  const bool print_ids = o.print_token_ids || !tokenizer;
  std::optional<StreamDecoder> text;
  if (!print_ids && speaks) text.emplace(*tokenizer, true);
  // When the text goes to a file or pipe, a terminal still sees how fast tokens come.
  std::optional<Progress> progress;
  if (speaks && !isatty(STDOUT_FILENO) && Progress::stderr_is_terminal())
    progress.emplace("generating", uint64_t(flags.max_new_tokens), "tokens");
  GenerationResult result = generate(*session, request, [&](int32_t id) {
    if (progress) progress->advance(1);
    if (!text) return;
    std::fputs(text->push(id).c_str(), stdout);
    std::fflush(stdout);
  });
  if (!speaks) return;
  if (progress) progress->finish();
  if (text) std::printf("%s\n", text->flush().c_str());
  if (print_ids) {
    std::string line;
    for (int32_t id : result.tokens) line += (line.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);  // the text before the report, also when stdout is a pipe
  print_report(request.prompt, result, sampling, engine, *session, engine.backend(), flags.model_path);
}

void run(const RunOptions& o) {
  check_generation_flags(o.gen);  // before any loading: a bad flag fails fast
  check_prompt_flags(o);
  GenerationFlags flags = o.gen;
  draw_seed_for_ranks(flags);
  const std::string prompt = prompt_text(o);
  run_tensor_parallel(engine_options(flags), [&](Engine& engine) { run_on(o, flags, prompt, engine); });
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  o->prompt_flag = cmd->add_option("-p,--prompt", o->prompt, "The prompt text");
  o->prompt_file_flag = cmd->add_option("--prompt_file,--prompt-file", o->prompt_file,
                                        "Read the prompt from this file (- = standard input)");
  o->prompt_tokens_flag = cmd->add_option("--prompt_tokens,--prompt-tokens", o->prompt_tokens,
                                          "Prompt as token ids (1,2,3), no tokenizer needed");
  add_generation_flags(*cmd, o->gen);
  cmd->add_flag("--raw_prompt,--raw-prompt", o->raw_prompt, "Do not apply the chat template");
  cmd->add_flag("--print_token_ids,--print-token-ids", o->print_token_ids, "Print the generated ids (one line) instead of text");
  cmd->add_flag("--ignore_eos,--ignore-eos", o->ignore_eos,
                "No token ends the reply: generate all --max_new_tokens (for measuring, as llama.cpp's --ignore-eos)");
  cmd->callback([o] { run(*o); });
}

}  // namespace g4::cli
