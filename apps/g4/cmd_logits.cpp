// g4 logits: the logits of every position for given token ids (the correctness oracle).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "cli_util.h"
#include "commands.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "util/error.h"

namespace g4::cli {

namespace {

struct LogitsOptions {
  std::string model_path, tokens, out, backend = "cpu";
  int64_t prefill_chunk = 0, max_seq_len = 0;
  KvTypeFlags kv;
};

void run_logits(const LogitsOptions& o) {
  const std::vector<int32_t> ids = parse_id_list(o.tokens);
  G4_CHECK(o.max_seq_len >= 0, "--max_seq_len must be a context size (0 = fit the tokens), got " +
                                   std::to_string(o.max_seq_len));
  G4_CHECK(o.prefill_chunk >= 0, "--prefill_chunk must be >= 0 (0 = as large as allowed), got " +
                                     std::to_string(o.prefill_chunk));
  const KvTypeChoice kv = o.kv.choice();
  auto backend = make_backend(o.backend);
  LoadedProgram loaded = load_program(o.model_path, *backend);
  const std::unique_ptr<Gemma4> model = std::move(loaded.model);
  SessionOptions so;
  so.kv_types = kv.over(loaded.program.kv_types);
  const ModelConfig& c = model->config();
  // Room for the tokens in one prefill (hence + 1), but never less than the model can run with
  // (a sliding layer's ring holds a whole window); a longer list than the model's context
  // length is then reported by the session as a full context.
  so.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len
                                     : std::max(std::min(int64_t(ids.size()) + 1, c.max_position_embeddings),
                                                min_max_seq_len(c));
  Session session(*model, *backend, so);
  const std::vector<float> logits = session.logits_all(ids, o.prefill_chunk);
  const int64_t vocab = model->config().vocab_size;
  std::ofstream out(o.out, std::ios::binary);
  G4_CHECK(out.good(), "cannot write '" + o.out + "'");
  out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  G4_CHECK(out.good(), "failed writing '" + o.out + "'");
  const float* last = logits.data() + (ids.size() - 1) * size_t(vocab);
  const int64_t argmax = std::max_element(last, last + vocab) - last;
  nlohmann::json summary = {{"positions", ids.size()}, {"vocab", vocab}, {"argmax_last", argmax}, {"out", o.out}};
  std::printf("%s\n", summary.dump().c_str());
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto opts = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "Write the logits of every position for given token ids");
  cmd->add_option("-m,--model_path,--model-path", opts->model_path, "Model file (.gguf) or Hugging Face checkpoint directory")->required();
  cmd->add_option("--tokens", opts->tokens, "Comma-separated token ids, e.g. 2,105,2364")->required();
  cmd->add_option("--out", opts->out, "Output file: float32 little-endian [position][vocab]")->required();
  cmd->add_option("--prefill_chunk,--prefill-chunk", opts->prefill_chunk, "Tokens per prefill chunk (default: max)");
  cmd->add_option("--max_seq_len,--max-seq-len", opts->max_seq_len, "Context size (default: the token count + 1, at least the model's sliding window)");
  cmd->add_option("--backend", opts->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  add_kv_type_flags(*cmd, opts->kv);
  cmd->callback([opts] { run_logits(*opts); });
}

}  // namespace g4::cli
