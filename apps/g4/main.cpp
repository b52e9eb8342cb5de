// g4: one binary, sub-commands (SPEC.md). Each command lives in its own cmd_*.cpp.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"g4: Gemma 4 runtime that samples the next token on the device"};
  app.require_subcommand(1);
  app.footer("Start here: g4 run --prompt \"Tell me a fortune about computers.\"  (runs the built-in demo model)\n"
             "Each command has its own --help, e.g. g4 run --help.");
  app.set_help_all_flag("--help-all", "Show help for every command");
  g4::cli::add_run_command(app);
  g4::cli::add_logits_command(app);
  g4::cli::add_bench_command(app);
  g4::cli::add_export_command(app);
  g4::cli::add_inspect_command(app);
  g4::cli::add_sample_command(app);
  g4::cli::add_tokenize_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const g4::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return g4::cli::kFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return g4::cli::kFailure;
  }
  return 0;
}
