// g4 tokenize / g4 detokenize: the tokenizer alone, so anyone can compare our ids with another
// implementation's.
#include <cstdio>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "model/loader.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4::cli {
namespace {

// Where the tokenizer comes from: a tokenizer.json, or a model's own (the demo model's when
// neither is given).
struct TokenizerSource {
  std::string tokenizer_path, model_path;
};

struct TokenizeOptions {
  TokenizerSource source;
  std::string text;
  std::string text_file;
  bool special = false;
};

struct DetokenizeOptions {
  TokenizerSource source;
  std::string ids;
};

void add_source_flags(CLI::App& cmd, TokenizerSource& source) {
  CLI::Option* tokenizer =
      cmd.add_option("--tokenizer_path,--tokenizer-path", source.tokenizer_path, "Hugging Face tokenizer.json");
  CLI::Option* model = cmd.add_option("-m,--model_path,--model-path", source.model_path,
                                      "Use this model's tokenizer (.gguf or checkpoint directory; default: the demo model)");
  tokenizer->excludes(model);
}

Tokenizer open(const TokenizerSource& source) { return open_tokenizer_of(source.tokenizer_path, source.model_path); }

void write_stdout(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

void run_tokenize(const TokenizeOptions& options) {
  const Tokenizer tokenizer = open(options.source);
  const std::string text = options.text_file.empty() ? options.text : read_input(options.text_file);
  std::string json = "[";
  for (const int32_t id : tokenizer.encode(text, options.special)) {
    if (json.size() > 1) json += ',';
    json += std::to_string(id);
  }
  write_stdout(json + "]\n");
}

void run_detokenize(const DetokenizeOptions& options) {
  const Tokenizer tokenizer = open(options.source);
  // Exactly the decoded text, no newline added: the output is meant to be compared byte for byte.
  write_stdout(tokenizer.decode(parse_id_list(options.ids)));
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto tokenize_options = std::make_shared<TokenizeOptions>();
  CLI::App* tokenize = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  add_source_flags(*tokenize, tokenize_options->source);
  CLI::Option* text = tokenize->add_option("--text", tokenize_options->text, "Text to tokenize");
  CLI::Option* text_file = tokenize->add_option("--text_file,--text-file", tokenize_options->text_file,
                                                "File whose bytes to tokenize (- = standard input)");
  text->excludes(text_file);
  tokenize->add_flag("--special", tokenize_options->special,
                     "Let special-token text (<bos>, <|turn>, ...) match special tokens");
  tokenize->callback([tokenize_options, text, text_file] {
    G4_CHECK(text->count() + text_file->count() == 1, "tokenize: give --text or --text_file");
    run_tokenize(*tokenize_options);
  });

  auto detokenize_options = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize = app.add_subcommand("detokenize", "Print the text of comma-separated token ids");
  add_source_flags(*detokenize, detokenize_options->source);
  detokenize->add_option("--ids", detokenize_options->ids, "Token ids, e.g. 2,9259,1902")->required();
  detokenize->callback([detokenize_options] { run_detokenize(*detokenize_options); });
}

}  // namespace g4::cli
