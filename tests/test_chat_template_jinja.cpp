// g4's native Gemma 4 chat rendering (format_gemma4_chat) against the official 31B-IT template
// (tests/fixtures/chat-templates/gemma-4-31B-it.jinja) rendered by a real Jinja engine,
// @huggingface/jinja under node, over a few hundred seeded conversations (docs/DESIGN.md §5).
// All conversations are rendered in one node run (tokenizer/render_chat_template.js), cached under
// a hash of its inputs. No network means this test fails with the npm error, never passes silently.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/npm_reference.h"
#include "tokenizer/chat_template.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using Conversation = std::vector<ChatMessage>;

constexpr const char* kJinjaVersion = "0.5.11";
const std::string kJinjaPackage = std::string("@huggingface/jinja@") + kJinjaVersion;
constexpr int kConversations = 400;

fs::path cache_dir() { return fs::path(G4_CACHE_DIR) / "chat-template"; }
fs::path npm_prefix() { return cache_dir() / "npm"; }
fs::path template_path() { return fs::path(G4_FIXTURES_DIR) / "chat-templates" / "gemma-4-31B-it.jinja"; }
fs::path script_path() { return fs::path(G4_SOURCE_DIR) / "tests" / "tokenizer" / "render_chat_template.js"; }

// Contents any role may have: blank ones, whitespace the template trims (ASCII and the Unicode
// spaces that Python's str.strip and JS's String.trim both remove), Unicode, and template-ish text.
const std::vector<std::string> kContents = {
    "Hello",
    "",
    "   ",
    "\n",
    "  padded on both sides  ",
    "\n\nnewlines around\n\n",
    "line one\nline two\n\nline four",
    "\t tab-led and trailing tab\t",
    "h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82",  // héllo wörld 日本語 🙂
    "\xC2\xA0no-break spaces\xC2\xA0",                                                      // U+00A0
    "\xE3\x80\x80ideographic space\xE3\x80\x80\n",                                          // U+3000
    "if a < b && c > d { return <x>; }",
    "{{ not_a_variable }} {% if x %} {# no comment #}",
    "{\"json\": [1, 2, {\"k\": \"v\"}]}",
    "<turn|> and <|turn> as plain text",
};
// Replies as a model writes them: the template drops thoughts from model turns.
const std::vector<std::string> kModelOnlyContents = {
    "<|channel>thought\nThe user wants a number.<channel|>It is 4.",
    "  Sure.  <|channel>hidden\nplan<channel|>  Done.  ",
    "<|channel>thought\n<channel|>",
    "A stray <channel|> closer and <|channel>an unclosed thought",
};

// 1-6 messages: an optional system first, then user and assistant alternating from user.
std::vector<Conversation> generate_conversations() {
  std::mt19937 rng(20261201);
  std::uniform_int_distribution<size_t> length(1, 6), any_content(0, kContents.size() - 1),
      model_content(0, kModelOnlyContents.size() - 1);
  std::bernoulli_distribution coin(0.5), rare(0.25);
  std::vector<Conversation> conversations;
  for (int i = 0; i < kConversations; ++i) {
    Conversation messages;
    const size_t count = length(rng);
    const bool system = rare(rng) || coin(rng);
    for (size_t k = 0; k < count; ++k) {
      const bool is_model = (k + (system ? 0 : 1)) % 2 == 0 && !(system && k == 0);
      std::string role = system && k == 0 ? "system" : is_model ? (rare(rng) ? "model" : "assistant") : "user";
      const std::string& content =
          is_model && coin(rng) ? kModelOnlyContents[model_content(rng)] : kContents[any_content(rng)];
      messages.push_back({std::move(role), content});
    }
    conversations.push_back(std::move(messages));
  }
  return conversations;
}

nlohmann::json to_json(const std::vector<Conversation>& conversations) {
  nlohmann::json all = nlohmann::json::array();
  for (const Conversation& messages : conversations) {
    nlohmann::json list = nlohmann::json::array();
    for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
    all.push_back(std::move(list));
  }
  return all;
}

// The renderings of @huggingface/jinja, computed once per build tree for these inputs.
nlohmann::json reference_renderings(const std::vector<Conversation>& conversations) {
  const std::string inputs_json = to_json(conversations).dump();
  const std::string key_text = inputs_json + test::read_text_file(script_path()) +
                               test::read_text_file(template_path()) + kJinjaPackage;
  const fs::path output = cache_dir() / ("renderings-" + std::to_string(std::hash<std::string>{}(key_text)) + ".json");
  {
    const test::DirectoryLock lock(cache_dir());
    test::npm_install_pinned(npm_prefix(), {kJinjaPackage});
    if (!fs::exists(output)) {
      const fs::path inputs_path = cache_dir() / "conversations.json";
      test::write_text_file(inputs_path, inputs_json);
      const fs::path partial = output.string() + ".partial";
      test::run_or_throw("node '" + script_path().string() + "' '" + (npm_prefix() / "node_modules").string() +
                             "' '" + template_path().string() + "' '" + inputs_path.string() + "' '" +
                             partial.string() + "'",
                         cache_dir() / "node.log", "the reference Jinja renderer (node " + script_path().string() + ")");
      fs::rename(partial, output);
    }
  }
  return nlohmann::json::parse(test::read_text_file(output));
}

std::string describe_mismatch(const Conversation& messages, const std::string& ours, const std::string& official) {
  const size_t offset = std::mismatch(ours.begin(), ours.end(), official.begin(), official.end()).first - ours.begin();
  return "conversation " + to_json({messages}).dump() + "\nfirst difference at byte " +
                     std::to_string(offset) + "\ng4:       " + nlohmann::json(ours).dump() +
                     "\nofficial: " + nlohmann::json(official).dump();
}

TEST(ChatTemplateJinja, NativeRenderingEqualsTheOfficialTemplate) {
  const std::vector<Conversation> conversations = generate_conversations();
  const nlohmann::json reference = reference_renderings(conversations);
  ASSERT_EQ(reference.at("version"), kJinjaVersion);
  // The template's default (enable_thinking undefined) is thinking off, as is g4's generation prompt.
  for (const char* variant : {"template_default", "thinking_off"}) {
    const auto official = reference.at(variant).get<std::vector<std::string>>();
    ASSERT_EQ(official.size(), conversations.size()) << variant;
    int mismatches = 0;
    for (size_t i = 0; i < conversations.size(); ++i) {
      const std::string ours = format_gemma4_chat(conversations[i]);
      if (ours == official[i]) continue;
      if (++mismatches <= 5) ADD_FAILURE() << variant << ": " << describe_mismatch(conversations[i], ours, official[i]);
    }
    EXPECT_EQ(mismatches, 0) << variant << ": of " << conversations.size() << " conversations";
  }
}

// The generator covers what the comparison is meant to cover.
TEST(ChatTemplateJinja, ConversationsCoverSystemModelThoughtsAndEveryLength) {
  const std::vector<Conversation> conversations = generate_conversations();
  ASSERT_EQ(conversations.size(), static_cast<size_t>(kConversations));
  std::vector<int> by_length(7);
  int with_system = 0, with_model_role = 0, with_thought = 0;
  for (const Conversation& messages : conversations) {
    ++by_length.at(messages.size());
    with_system += messages.front().role == "system";
    for (const ChatMessage& message : messages) {
      with_model_role += message.role == "model";
      with_thought += message.content.find("<|channel>") != std::string::npos;
    }
  }
  for (size_t length = 1; length <= 6; ++length) EXPECT_GT(by_length[length], 20) << length;
  EXPECT_GT(with_system, 50);
  EXPECT_GT(with_model_role, 20);
  EXPECT_GT(with_thought, 50);
}

}  // namespace
}  // namespace g4
