// The demo model's training chats (tools/demo/demo_chat_corpus.py, docs/DESIGN.md §6 "Demo model") are
// the official 31B-IT template's text: the script renders its conversations (tool declarations,
// calls, responses, answers, plain chats) and checks them byte for byte against @huggingface/jinja
// rendering tests/fixtures/chat-templates/gemma-4-31B-it.jinja, and each completion against what the
// template writes for the model's message. Same npm package, version and cache as
// test_chat_template_jinja; the ChatTemplateJinja suite name keeps it out of tools/gpu/gpu_check.sh
// (no network there). No node, npm, network or python3 makes it fail, never pass silently.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/npm_reference.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;

TEST(ChatTemplateJinja, DemoChatCorpusIsTheOfficialTemplatesText) {
  const fs::path cache = fs::path(G4_CACHE_DIR) / "chat-template";
  const test::DirectoryLock lock(cache);
  test::npm_install_pinned(cache / "npm", {"@huggingface/jinja@0.5.11"});
  const fs::path log = cache / "demo-chat-corpus.log";
  test::run_or_throw("python3 '" + std::string(G4_SOURCE_DIR) + "/tools/demo/demo_chat_corpus.py' check '" +
                         (cache / "npm" / "node_modules").string() + "' 600",
                     log, "tools/demo/demo_chat_corpus.py check");
  EXPECT_NE(test::read_text_file(log).find("equal the official template"), std::string::npos)
      << test::read_text_file(log);
}

}  // namespace
}  // namespace g4
