// g4's native Gemma 4 chat rendering (format_gemma4_chat) against the official 31B-IT template
// (tests/fixtures/chat-templates/gemma-4-31B-it.jinja) rendered by a real Jinja engine,
// @huggingface/jinja under node, over a few hundred seeded conversations (docs/DESIGN.md §5):
// system/developer turns, thinking on/off/default, tool declarations, tool calls with reasoning,
// tool responses, text parts, thoughts in replies.
// All conversations are rendered in one node run (tokenizer/render_chat_template.js), cached under
// a hash of its inputs. No network means this test fails with the npm error, never passes silently.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
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

// What one rendering takes besides the messages.
struct Conversation {
  std::vector<ChatMessage> messages;
  ChatOptions options;
  std::optional<bool> thinking_given;  // nullopt: enable_thinking left out (the template's default)
};

// Keys of tool arguments and schema properties: mixed case (dictsort ignores case), no two equal
// but for case (Python's and JS's sorts would then keep different orders of the input).
const std::vector<std::string> kKeys = {"city", "Unit", "zip_code", "max_results", "Query", "b", "a_1", "limit", "Items", "nested"};
// Floats both engines print alike: not integral (JS prints 2.0 as "2"), within [1e-4, 1e16) (the
// notations switch elsewhere). Integers within 2^53 (JS numbers).
const std::vector<double> kFloats = {2.5, -0.75, 0.001, 3.14159, 12345.678, 0.0001, 1e15 + 0.5};

class ConversationGenerator {
 public:
  explicit ConversationGenerator(uint32_t seed) : rng_(seed) {}

  Conversation next() {
    Conversation c;
    const int thinking = pick(3);
    if (thinking < 2) c.thinking_given = thinking == 1;
    c.options.enable_thinking = c.thinking_given.value_or(false);
    if (chance(0.4)) c.options.tools = tools();
    c.options.add_generation_prompt = chance(0.9);
    if (chance(0.4)) c.messages.push_back({chance(0.7) ? "system" : "developer", content()});
    const int exchanges = 1 + pick(3);
    for (int e = 0; e < exchanges; ++e) {
      c.messages.push_back(user_message());
      if (e + 1 == exchanges && chance(0.3)) break;  // ends on the user
      append_model_reply(c.messages);
    }
    if (chance(0.05)) c.messages.insert(c.messages.begin() + pick(int(c.messages.size())), ChatMessage{"system", content()});
    if (chance(0.05)) c.messages.push_back(ChatMessage{"tool", content()});  // OpenAI's role, as the template writes it
    return c;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <typename T>
  const T& any(const std::vector<T>& list) { return list[size_t(pick(int(list.size())))]; }

  std::string content() { return any(kContents); }

  ChatMessage user_message() {
    ChatMessage m{"user", content()};
    if (chance(0.15)) m.text_parts = std::vector<std::string>{content(), content()};
    return m;
  }

  nlohmann::json value(int depth) {
    switch (pick(depth < 2 ? 7 : 5)) {
      case 0: return content();
      case 1: return int64_t(pick(2000001)) - 1000000;
      case 2: return any(kFloats);
      case 3: return chance(0.5);
      case 4: return any(kKeys);
      case 5: {
        nlohmann::json list = nlohmann::json::array();
        for (int i = pick(4); i > 0; --i) list.push_back(value(depth + 1));
        return list;
      }
      default: return object(depth + 1);
    }
  }

  nlohmann::json object(int depth) {
    nlohmann::json o = nlohmann::json::object();
    for (int i = pick(4); i > 0; --i) o[any(kKeys)] = value(depth);
    return o;
  }

  nlohmann::json property(int depth) {
    static const std::vector<std::string> kTypes = {"string", "integer", "number", "boolean", "object", "array", "STRING"};
    const std::string type = any(depth < 2 ? kTypes : std::vector<std::string>{"string", "integer", "boolean"});
    nlohmann::json p = {{"type", type}};
    if (chance(0.7)) p["description"] = content();
    if (chance(0.15)) p["nullable"] = chance(0.7);
    if ((type == "string" || type == "STRING") && chance(0.4)) p["enum"] = {any(kKeys), any(kKeys)};
    if (type == "object") {
      p["properties"] = properties(depth + 1);
      if (chance(0.5)) p["required"] = {any(kKeys)};
    }
    if (type == "array" && chance(0.8)) {
      p["items"] = chance(0.6) ? nlohmann::json{{"type", any(kTypes)}}
                               : nlohmann::json{{"type", "object"}, {"properties", properties(depth + 1)}, {"required", {any(kKeys)}},
                                                {"description", nullptr}};
    }
    return p;
  }

  nlohmann::json properties(int depth) {
    nlohmann::json o = nlohmann::json::object();
    for (int i = pick(4); i > 0; --i) o[any(kKeys)] = property(depth);
    if (chance(0.05)) o["description"] = property(depth);  // a schema keyword as a name: skipped
    return o;
  }

  nlohmann::json tools() {
    nlohmann::json list = nlohmann::json::array();
    for (int i = 1 + pick(3); i > 0; --i) {
      nlohmann::json function = {{"name", any(kKeys) + "_tool"}};
      if (chance(0.8)) function["description"] = content();
      if (chance(0.85)) {
        nlohmann::json parameters = {{"type", "object"}, {"properties", properties(0)}};
        if (chance(0.6)) parameters["required"] = {any(kKeys), any(kKeys)};
        if (chance(0.1)) parameters.erase("type");
        function["parameters"] = parameters;
      }
      if (chance(0.1)) function["response"] = {{"description", content()}, {"type", chance(0.5) ? "object" : "string"}};
      list.push_back({{"type", "function"}, {"function", function}});
    }
    return list;
  }

  ChatMessage with_tool_calls() {
    ChatMessage m{chance(0.9) ? "assistant" : "model", chance(0.6) ? "" : content()};
    for (int i = 1 + pick(2); i > 0; --i)
      m.tool_calls.push_back({any(kKeys) + "_tool", chance(0.9) ? object(0) : nlohmann::json(content())});
    if (chance(0.5)) m.reasoning_content = content();
    if (chance(0.8))
      for (const ChatToolCall& call : m.tool_calls)
        m.tool_responses.push_back({call.name, chance(0.7) ? object(0) : value(1)});
    return m;
  }

  // A plain reply, or tool calls (each with its responses, as the template takes them) and maybe
  // more calls continuing the open turn, then often a final answer.
  void append_model_reply(std::vector<ChatMessage>& messages) {
    if (chance(0.5)) {
      ChatMessage m{chance(0.85) ? "assistant" : "model", chance(0.5) ? any(kModelOnlyContents) : content()};
      if (chance(0.2)) m.reasoning_content = content();  // without tool calls: never written
      if (chance(0.1)) m.text_parts = std::vector<std::string>{any(kModelOnlyContents), content()};
      messages.push_back(std::move(m));
      return;
    }
    for (int calls = 1 + pick(2); calls > 0; --calls) messages.push_back(with_tool_calls());
    if (chance(0.6)) messages.push_back({"assistant", content()});
  }

  std::mt19937 rng_;
};

std::vector<Conversation> generate_conversations() {
  ConversationGenerator generator(20261201);
  std::vector<Conversation> conversations;
  for (int i = 0; i < kConversations; ++i) conversations.push_back(generator.next());
  return conversations;
}

// A message with the template's field names; empty content is left out, null or "" (all alike).
nlohmann::json to_json(const ChatMessage& m, size_t index) {
  nlohmann::json j = {{"role", m.role}};
  if (m.text_parts) {
    j["content"] = nlohmann::json::array();
    for (const std::string& text : *m.text_parts) j["content"].push_back({{"type", "text"}, {"text", text}});
  } else if (!m.content.empty() || index % 3 == 0) {
    j["content"] = m.content;
  } else if (index % 3 == 1) {
    j["content"] = nullptr;
  }
  if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
  for (const ChatToolCall& call : m.tool_calls)
    j["tool_calls"].push_back({{"id", "call_" + std::to_string(index)},
                               {"type", "function"},
                               {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  for (const ChatToolResponse& r : m.tool_responses) j["tool_responses"].push_back({{"name", r.name}, {"response", r.response}});
  return j;
}

nlohmann::json to_json(const Conversation& c) {
  nlohmann::json j = {{"messages", nlohmann::json::array()}, {"add_generation_prompt", c.options.add_generation_prompt}};
  for (size_t i = 0; i < c.messages.size(); ++i) j["messages"].push_back(to_json(c.messages[i], i));
  if (!c.options.tools.empty()) j["tools"] = c.options.tools;
  if (c.thinking_given) j["enable_thinking"] = *c.thinking_given;
  return j;
}

nlohmann::json to_json(const std::vector<Conversation>& conversations) {
  nlohmann::json all = nlohmann::json::array();
  for (const Conversation& c : conversations) all.push_back(to_json(c));
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

std::string describe_mismatch(const Conversation& c, const std::string& ours, const std::string& official) {
  const size_t offset = std::mismatch(ours.begin(), ours.end(), official.begin(), official.end()).first - ours.begin();
  return "conversation " + to_json(c).dump() + "\nfirst difference at byte " + std::to_string(offset) +
         "\ng4:       " + nlohmann::json(ours).dump() + "\nofficial: " + nlohmann::json(official).dump();
}

TEST(ChatTemplateJinja, NativeRenderingEqualsTheOfficialTemplate) {
  const std::vector<Conversation> conversations = generate_conversations();
  const nlohmann::json reference = reference_renderings(conversations);
  ASSERT_EQ(reference.at("version"), kJinjaVersion);
  const nlohmann::json& official = reference.at("renderings");
  ASSERT_EQ(official.size(), conversations.size());
  int mismatches = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    ASSERT_TRUE(official[i].is_string()) << "the Jinja engine refused conversation " << to_json(conversations[i]).dump()
                                         << ": " << official[i].dump();
    const std::string ours = format_gemma4_chat(conversations[i].messages, conversations[i].options);
    if (ours == official[i].get<std::string>()) continue;
    if (++mismatches <= 5) ADD_FAILURE() << describe_mismatch(conversations[i], ours, official[i]);
  }
  EXPECT_EQ(mismatches, 0) << "of " << conversations.size() << " conversations";
}

// The generator covers what the comparison is meant to cover.
TEST(ChatTemplateJinja, ConversationsCoverEveryPartOfTheFormat) {
  const std::vector<Conversation> conversations = generate_conversations();
  ASSERT_EQ(conversations.size(), static_cast<size_t>(kConversations));
  std::map<std::string, int> seen;
  for (const Conversation& c : conversations) {
    ++seen[c.thinking_given ? (*c.thinking_given ? "thinking on" : "thinking off") : "thinking by default"];
    seen["tools declared"] += !c.options.tools.empty();
    seen["no generation prompt"] += !c.options.add_generation_prompt;
    const std::string& first = c.messages.front().role;
    seen["system first"] += first == "system";
    seen["developer first"] += first == "developer";
    for (const ChatMessage& m : c.messages) {
      seen["model role"] += m.role == "model";
      seen["thought in content"] += m.content.find("<|channel>") != std::string::npos;
      seen["text parts"] += m.text_parts.has_value();
      seen["tool calls"] += !m.tool_calls.empty();
      seen["string arguments"] += !m.tool_calls.empty() && m.tool_calls[0].arguments.is_string();
      seen["reasoning with calls"] += !m.tool_calls.empty() && !m.reasoning_content.empty();
      seen["tool responses"] += !m.tool_responses.empty();
      seen["tool role"] += m.role == "tool";
    }
  }
  for (const char* what : {"thinking on", "thinking off", "thinking by default", "tools declared", "system first",
                           "developer first", "model role", "thought in content", "text parts", "tool calls",
                           "reasoning with calls", "tool responses"})
    EXPECT_GT(seen[what], 30) << what;
  for (const char* what : {"no generation prompt", "string arguments", "tool role"}) EXPECT_GT(seen[what], 5) << what;
}

}  // namespace
}  // namespace g4
