// g4 export: a Hugging Face checkpoint -> one GGUF model file (the "program", docs/DESIGN.md §3).
#include <cstdio>
#include <memory>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "model/hf_checkpoint.h"
#include "model/gguf_export.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/progress.h"

namespace g4::cli {

namespace {

struct ExportCommandOptions {
  std::string model_dir, output, weights;
  bool quantize_embedding = false;
  bool sample = false;
  int64_t max_seq_len = 0;
  KvTypeFlags kv;  // recorded in the file; bf16 when not given
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void print_tensor(const ExportedTensor& t) {
  std::printf("%-36s %-14s %5s -> %-5s %12llu bytes%s%s\n", t.name.c_str(), shape_text(t.shape).c_str(),
              dtype_name(t.source).c_str(), dtype_name(t.stored).c_str(), static_cast<unsigned long long>(t.bytes),
              t.note.empty() ? "" : "  note: ", t.note.c_str());
}

void run_export(const ExportCommandOptions& o) {
  ExportOptions options;
  options.use_sampling = o.sample;
  options.max_seq_len = o.max_seq_len;
  options.q4_k_m = o.weights == "q4_k_m";
  if (!o.weights.empty()) options.weights = parse_weight_dtype(options.q4_k_m ? "q4_k" : o.weights);
  options.quantize_embedding = o.quantize_embedding;
  options.kv_types = o.kv.choice().over({});
  G4_CHECK(o.max_seq_len >= 0, "--max-seq-len must be positive");
  HfCheckpoint checkpoint(o.model_dir, HfCheckpoint::role_of(o.model_dir));
  // A terminal gets a progress bar; logs get one line per tensor.
  std::optional<Progress> progress;
  if (Progress::stderr_is_terminal()) {
    const ModelConfig& c = checkpoint.config();
    progress.emplace("exporting", expected_tensors(c).size() + (rope_freq_factors(c).empty() ? 0 : 1), "tensors");
  }
  const ExportResult r = export_gguf(checkpoint, o.output, options, [&](const ExportedTensor& t) {
    if (progress) {
      progress->advance(1);
    } else {
      print_tensor(t);
    }
  });
  if (progress) progress->finish();
  std::printf("wrote %s: %zu tensors, %llu bytes; g4.use_sampling=%s g4.max_seq_len=%lld "
              "g4.max_prefill_chunk=%lld g4.min_prefill_chunk=%lld; KV caches %s full, %s sliding; tokenizer %s\n",
              o.output.c_str(), r.tensor_count, static_cast<unsigned long long>(r.file_bytes),
              r.program.use_sampling ? "true" : "false", static_cast<long long>(r.program.max_seq_len),
              static_cast<long long>(r.program.max_prefill_chunk), static_cast<long long>(r.program.min_prefill_chunk),
              kv_type_name(r.program.kv_types.full).c_str(), kv_type_name(r.program.kv_types.sliding).c_str(),
              r.tokenizer_embedded ? "embedded" : "not embedded (no tokenizer.json in the checkpoint)");
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto opts = std::make_shared<ExportCommandOptions>();
  CLI::App* cmd = app.add_subcommand("export", "Export a Hugging Face checkpoint to one GGUF model file");
  cmd->add_option("--model-dir,--model_dir", opts->model_dir, "Hugging Face checkpoint directory")->required();
  cmd->add_option("--output", opts->output, "The model file to write (.gguf)")->required();
  cmd->add_flag("--sample", opts->sample, "Make a sampling program (forward returns the sampled token)");
  cmd->add_option("--weights", opts->weights,
                  "Matrix dtype: f32, bf16, f16, q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, or q4_k_m "
                  "(llama.cpp's mix of q4_k and q6_k) (default: each matrix's checkpoint dtype); norms stay f32, the "
                  "embedding stays q8_0 under fewer than 8 bits");
  cmd->add_flag("--quantize-embedding,--quantize_embedding", opts->quantize_embedding,
                "Store the token embedding in --weights' type even below 8 bits");
  cmd->add_option("--max-seq-len,--max_seq_len", opts->max_seq_len,
                  "Context size (default: min(max_position_embeddings, 4096))");
  cmd->add_option("--kv_type,--kv-type", opts->kv.full,
                  "KV cache of the full-attention layers that runs of the file take unless they choose: bf16, q8_0 "
                  "or tq4 (default bf16)");
  cmd->add_option("--kv_sliding_type,--kv-sliding-type", opts->kv.sliding,
                  "KV cache of the sliding-window layers that runs take unless they choose: bf16 or q8_0 (default "
                  "bf16)");
  cmd->callback([opts] { run_export(*opts); });
}

}  // namespace g4::cli
