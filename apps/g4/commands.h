// Each sub-command of the g4 binary registers itself on the CLI11 app (one file per command).
#pragma once
#include <CLI/CLI.hpp>

namespace g4::cli {

// Exit code of a command that failed with a g4::Error (message already printed).
inline constexpr int kFailure = 1;
// What g4 --version prints (with the backends built in).
inline constexpr const char* kVersion = "0.1.0";

void add_logits_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_tokenize_commands(CLI::App& app);
void add_serve_command(CLI::App& app);


}  // namespace g4::cli
