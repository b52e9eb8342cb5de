// g4: one binary, sub-commands. Each command lives in its own cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "util/error.h"

namespace {

#ifndef G4_HAVE_CUDA
constexpr const char* kBackends = "cpu";
#else
constexpr const char* kBackends = "cpu, cuda";
#endif

// CLI11 would answer "The following arguments were not expected: foo"; a mistyped command
// deserves its own name and the list to pick from.
bool is_unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->check_name(argv[1])) return false;
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names += "  " + sub->get_name() + std::string(20 - std::min<size_t>(19, sub->get_name().size()), ' ') +
             sub->get_description() + "\n";
  std::fprintf(stderr, "g4: unknown command '%s'. The commands are:\n%sRun g4 <command> --help for its flags.\n",
               argv[1], names.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"g4: Gemma 4 runtime that samples the next token on the device"};
  app.require_subcommand(1);
  app.footer("Start here: g4 run --prompt \"Tell me a fortune about computers.\"  (runs the built-in demo model)\n"
             "Or talk to it: g4 chat\n"
             "Each command has its own --help, e.g. g4 run --help.");
  app.set_help_all_flag("--help-all", "Show help for every command");
  app.set_version_flag("--version", std::string("g4 ") + g4::cli::kVersion + " (backends: " + kBackends + ")");
  g4::cli::add_run_command(app);
  g4::cli::add_chat_command(app);
  g4::cli::add_serve_command(app);
  g4::cli::add_logits_command(app);
  g4::cli::add_perplexity_command(app);
  g4::cli::add_bench_command(app);
  g4::cli::add_export_command(app);
  g4::cli::add_inspect_command(app);
  g4::cli::add_sample_command(app);
  g4::cli::add_tokenize_commands(app);
  if (is_unknown_command(app, argc, argv)) return g4::cli::kFailure;
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
