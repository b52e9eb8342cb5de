// g4 perplexity: a model's perplexity on a text and, against a base model, the KL divergence of its
// next-token distributions, measured as llama.cpp's llama-perplexity does (runtime/perplexity.h),
// so that quantized files can be compared across the two runtimes.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "cli_util.h"
#include "commands.h"
#include "model/loader.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4::cli {

namespace {

struct PerplexityFlags {
  std::string model_path, base_path, tokenizer_path, text_file, backend = "cpu";
  PerplexityOptions measure;
  KvTypeFlags kv;  // the measured model's caches; the --kl_base model's are bf16
};

void run_perplexity(const PerplexityFlags& f) {
  const KvTypeChoice kv_types = f.kv.choice();
  const Tokenizer tokenizer = open_tokenizer_of(f.tokenizer_path, f.model_path);
  // As llama-perplexity tokenizes the file: BOS, then the text (special-token text is plain text).
  std::vector<int32_t> tokens = {f.measure.bos_id};
  for (const int32_t id : tokenizer.encode(read_input(f.text_file), false)) tokens.push_back(id);

  auto backend = make_backend(f.backend);
  LoadedProgram loaded = load_program(f.model_path, *backend);
  const std::unique_ptr<Gemma4> model = std::move(loaded.model);
  SessionOptions so;
  so.max_seq_len = std::max(f.measure.n_ctx, min_max_seq_len(model->config()));
  G4_CHECK(f.measure.bos_id >= 0 && f.measure.bos_id < model->config().vocab_size,
           "--bos_id " + std::to_string(f.measure.bos_id) + " is outside the model's vocabulary");
  SessionOptions measured = so;
  measured.kv_types = kv_types.over(loaded.program.kv_types);
  Session session(*model, *backend, measured);
  std::unique_ptr<Gemma4> base_model;
  std::unique_ptr<Session> base;
  if (!f.base_path.empty()) {
    base_model = load_model(f.base_path, *backend);
    base = std::make_unique<Session>(*base_model, *backend, so);
  }
  const PerplexityResult r = measure_perplexity(session, base.get(), tokens, f.measure);
  nlohmann::json out = {{"model", f.model_path},     {"text_tokens", tokens.size()}, {"n_ctx", f.measure.n_ctx},
                        {"chunks", r.chunks},        {"scored_tokens", r.scored},    {"perplexity", r.perplexity},
                        {"perplexity_error", r.perplexity_error}};
  if (base) {
    out["base"] = f.base_path;
    out["mean_kl"] = *r.mean_kl;
    out["mean_kl_error"] = *r.mean_kl_error;
    out["same_top_token"] = *r.same_top_token;
    out["clear_positions"] = r.clear_positions;  // the base's top-2 margin > kClearTopMargin
    if (r.same_top_token_clear) out["same_top_token_clear"] = *r.same_top_token_clear;
  }
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto f = std::make_shared<PerplexityFlags>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a text, and KL divergence from a base model (as llama.cpp's llama-perplexity)");
  cmd->add_option("-m,--model_path,--model-path", f->model_path, "Model file (.gguf) or checkpoint directory")->required();
  cmd->add_option("-f,--text_file,--text-file", f->text_file, "The text to score (- = standard input)")->required();
  cmd->add_option("--kl_base,--kl-base", f->base_path,
                  "Base model (e.g. the bf16 file, or the same file: quantized against bf16 KV caches) for the KL "
                  "divergence; it runs with bf16 KV caches");
  cmd->add_option("--tokenizer_path,--tokenizer-path", f->tokenizer_path, "Hugging Face tokenizer.json (default: the model's)");
  cmd->add_option("-c,--ctx_size,--ctx-size", f->measure.n_ctx, "Tokens per chunk; the second half of each is scored")
      ->capture_default_str();
  cmd->add_option("--chunks", f->measure.max_chunks, "Score at most this many chunks (0 = all)")->capture_default_str();
  cmd->add_option("--bos_id,--bos-id", f->measure.bos_id, "Beginning-of-sequence id of each chunk")->capture_default_str();
  cmd->add_option("--backend", f->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  add_kv_type_flags(*cmd, f->kv);
  cmd->callback([f] { run_perplexity(*f); });
}

}  // namespace g4::cli
