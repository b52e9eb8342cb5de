// g4 tokenize / g4 detokenize: the tokenizer alone, so anyone can compare our ids with another
// implementation's.
#include <cstdio>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/files.h"

namespace g4::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer_path;
  std::string text;
  std::string text_file;
  bool special = false;
};

struct DetokenizeOptions {
  std::string tokenizer_path;
  std::string ids;
};

void write_stdout(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

void run_tokenize(const TokenizeOptions& options) {
  const Tokenizer tokenizer = Tokenizer::from_file(options.tokenizer_path);
  const std::string text = options.text_file.empty() ? options.text : read_file(options.text_file);
  std::string json = "[";
  for (const int32_t id : tokenizer.encode(text, options.special)) {
    if (json.size() > 1) json += ',';
    json += std::to_string(id);
  }
  write_stdout(json + "]\n");
}

void run_detokenize(const DetokenizeOptions& options) {
  const Tokenizer tokenizer = Tokenizer::from_file(options.tokenizer_path);
  // Exactly the decoded text, no newline added: the output is meant to be compared byte for byte.
  write_stdout(tokenizer.decode(parse_id_list(options.ids)));
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto tokenize_options = std::make_shared<TokenizeOptions>();
  CLI::App* tokenize = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  tokenize->add_option("--tokenizer_path,--tokenizer-path", tokenize_options->tokenizer_path,
                       "Hugging Face tokenizer.json")
      ->required();
  CLI::Option* text = tokenize->add_option("--text", tokenize_options->text, "Text to tokenize");
  CLI::Option* text_file =
      tokenize->add_option("--text_file,--text-file", tokenize_options->text_file, "File whose bytes to tokenize");
  text->excludes(text_file);
  tokenize->add_flag("--special", tokenize_options->special,
                     "Let special-token text (<bos>, <|turn>, ...) match special tokens");
  tokenize->callback([tokenize_options, text, text_file] {
    G4_CHECK(text->count() + text_file->count() == 1, "tokenize: give --text or --text_file");
    run_tokenize(*tokenize_options);
  });

  auto detokenize_options = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize = app.add_subcommand("detokenize", "Print the text of comma-separated token ids");
  detokenize->add_option("--tokenizer_path,--tokenizer-path", detokenize_options->tokenizer_path,
                         "Hugging Face tokenizer.json")
      ->required();
  detokenize->add_option("--ids", detokenize_options->ids, "Token ids, e.g. 2,9259,1902")->required();
  detokenize->callback([detokenize_options] { run_detokenize(*detokenize_options); });
}

}  // namespace g4::cli
