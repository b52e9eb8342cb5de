// Gemma4OutputParser (docs/DESIGN.md §8): the model's reply split into content, reasoning and tool
// calls, the same whether the text arrives whole or cut at every byte; malformed calls come back as
// the content they are; the call syntax is the one format_gemma4_chat writes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/gemma4_output_parser.h"
#include "tokenizer/utf8.h"

namespace g4 {
namespace {

using nlohmann::json;

ParsedOutput parse_in_pieces(const std::vector<std::string>& pieces, bool tools = true) {
  Gemma4OutputParser parser({.parse_tool_calls = tools});
  ParsedOutput all;
  for (const std::string& piece : pieces) all.append(parser.push(piece));
  all.append(parser.finish());
  return all;
}

ParsedOutput parse_whole(const std::string& text, bool tools = true) { return parse_in_pieces({text}, tools); }

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

const std::string kCall = "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,metric:true}<tool_call|>";

TEST(OutputParser, PlainTextIsContent) {
  const ParsedOutput out = parse_whole("Hello, world. 1 < 2 and a|b.");
  EXPECT_EQ(out.content, "Hello, world. 1 < 2 and a|b.");
  EXPECT_TRUE(out.reasoning.empty());
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(OutputParser, ThoughtBecomesReasoning) {
  const ParsedOutput out = parse_whole("<|channel>thought\nThe user wants 2+2.<channel|>It is 4.");
  EXPECT_EQ(out.reasoning, "The user wants 2+2.");
  EXPECT_EQ(out.content, "It is 4.");
}

TEST(OutputParser, ToolCallBecomesACallWithJsonArguments) {
  const ParsedOutput out = parse_whole("Let me check. " + kCall);
  EXPECT_EQ(out.content, "Let me check. ");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments, (json{{"city", "Paris"}, {"days", 3}, {"metric", true}}));
}

TEST(OutputParser, ThoughtThenTwoCalls) {
  const ParsedOutput out = parse_whole("<|channel>thought\nTwo cities.<channel|>" + kCall +
                                       "<|tool_call>call:get_time{zone:<|\"|>UTC<|\"|>}<tool_call|>");
  EXPECT_EQ(out.reasoning, "Two cities.");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[1].name, "get_time");
  EXPECT_EQ(out.tool_calls[1].arguments, (json{{"zone", "UTC"}}));
}

// Every kind of value, nested, as the chat format writes it: reading back what
// format_gemma4_value wrote gives the same JSON.
TEST(OutputParser, ArgumentsRoundTripThroughTheChatFormat) {
  const json arguments = {{"s", "a \"quoted\" {text}, with: colons [and] brackets"},
                          {"empty", ""},
                          {"n", -12},
                          {"big", 9007199254740993ull},
                          {"x", 2.5},
                          {"tiny", 1.5e-7},
                          {"yes", true},
                          {"no", false},
                          {"nothing", nullptr},
                          {"list", {1, "two", {{"three", 3}}, json::array()}},
                          {"obj", {{"inner", {{"deep", {1, 2}}}}, {"Mixed", "Case"}}},
                          {"unicode", "h\xC3\xA9llo \xF0\x9F\x99\x82"}};
  const std::string body = "call:f{" + format_gemma4_value(arguments, false).substr(1);
  const std::optional<ParsedToolCall> call = parse_gemma4_tool_call(body);
  ASSERT_TRUE(call) << body;
  EXPECT_EQ(call->name, "f");
  EXPECT_EQ(call->arguments, arguments) << body;
  // Keys between <|"|> (format_argument's escape_keys) read the same.
  const std::optional<ParsedToolCall> quoted = parse_gemma4_tool_call("call:f{" + format_gemma4_value(arguments, true).substr(1));
  ASSERT_TRUE(quoted);
  EXPECT_EQ(quoted->arguments, arguments);
}

TEST(OutputParser, WhitespaceBetweenItemsIsAllowed) {
  const std::optional<ParsedToolCall> call = parse_gemma4_tool_call("call:f{ a : 1 ,\n b: [ 1 , 2 ] , c:{ } }");
  ASSERT_TRUE(call);
  EXPECT_EQ(call->arguments, (json{{"a", 1}, {"b", {1, 2}}, {"c", json::object()}}));
}

TEST(OutputParser, MalformedCallsAreContent) {
  for (const std::string body :
       {"call:f{city:Paris}", "call:f{city:<|\"|>Paris}", "call:{a:1}", "f{a:1}", "call:f{a:1", "call:f{a:1}}",
        "call:f{a:1,}", "call:f{:1}", "call:f{a:1e999}", "call:f{a:tru}", "call:f[1]", "call:f{a:1} trailing",
        "call:f{a:[1,2}", "call:f{a:--1}", "call:f{a{b:1}"}) {
    const std::string text = "<|tool_call>" + body + "<tool_call|>";
    const ParsedOutput out = parse_whole("x" + text + "y");
    EXPECT_TRUE(out.tool_calls.empty()) << body;
    EXPECT_EQ(out.content, "x" + text + "y") << body;
  }
}

TEST(OutputParser, DeepNestingIsMalformedNotACrash) {
  const std::string deep = "call:f{a:" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_FALSE(parse_gemma4_tool_call(deep));
  const std::string ok = "call:f{a:" + std::string(60, '[') + std::string(60, ']') + "}";
  EXPECT_TRUE(parse_gemma4_tool_call(ok));
}

TEST(OutputParser, UnfinishedEndingsComeBackAsTheyWere) {
  EXPECT_EQ(parse_whole("Hi <|tool_call>call:f{a:<|\"|>x").content, "Hi <|tool_call>call:f{a:<|\"|>x");
  EXPECT_EQ(parse_whole("Hi <|tool_ca").content, "Hi <|tool_ca");
  EXPECT_EQ(parse_whole("Hi <|channel>thought\nhalf a thought").reasoning, "half a thought");
  EXPECT_EQ(parse_whole("Hi <chan").content, "Hi <chan");
}

TEST(OutputParser, StrayCloserIsDroppedAndEmptyThoughtIsNothing) {
  const ParsedOutput out = parse_whole("a<channel|>b<|channel>thought\n<channel|>c<|channel>thought<channel|>d");
  EXPECT_EQ(out.content, "abcd");
  EXPECT_EQ(out.reasoning, "");
}

TEST(OutputParser, CloserInsideAStringDoesNotEndTheCall) {
  const ParsedOutput out = parse_whole("<|tool_call>call:echo{text:<|\"|>say <tool_call|> now<|\"|>}<tool_call|>after");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments, (json{{"text", "say <tool_call|> now"}}));
  EXPECT_EQ(out.content, "after");
}

TEST(OutputParser, WithoutToolsCallsStayContent) {
  const ParsedOutput out = parse_whole("a" + kCall + "<|channel>thought\nt<channel|>b", /*tools=*/false);
  EXPECT_EQ(out.content, "a" + kCall + "b");
  EXPECT_EQ(out.reasoning, "t");
  EXPECT_TRUE(out.tool_calls.empty());
}

// Nothing is released that a later piece could turn into a marker, and nothing is held longer.
TEST(OutputParser, HoldsBackOnlyWhatMayStartAMarker) {
  Gemma4OutputParser parser;
  EXPECT_EQ(parser.push("Hello <").content, "Hello ");
  EXPECT_EQ(parser.push("|tool").content, "");
  EXPECT_EQ(parser.push("box").content, "<|toolbox");
  EXPECT_EQ(parser.push("<|channel>thought\nthinking <chan").reasoning, "thinking ");
  EXPECT_EQ(parser.push("ge").reasoning, "<change");
}

// The same result whether the text comes whole, in two pieces cut at any byte, or byte by byte.
TEST(OutputParser, SplitAtEveryByteBoundary) {
  const std::vector<std::string> texts = {
      "Sure. <|channel>thought\nUser asks h\xC3\xA9llo.<channel|>Answer: " + kCall + " done",
      "<|tool_call>call:f{a:{b:[1,2.5,<|\"|>x<|\"|>]},c:None}<tool_call|><|tool_call>call:g{}<tool_call|>",
      "a<channel|>b <|tool_call>call:broken{a:}<tool_call|> <|tool_call>call:f{text:<|\"|><tool_call|><|\"|>}<tool_call|>",
      "<|channel>a very long channel name without any newline at all, which is taken as the thought itself, "
      "beyond sixty-four bytes<channel|>end <|tool_ca"};
  for (const std::string& text : texts) {
    const ParsedOutput whole = parse_whole(text);
    for (size_t cut = 0; cut <= text.size(); ++cut)
      expect_same(parse_in_pieces({text.substr(0, cut), text.substr(cut)}), whole, "cut at " + std::to_string(cut));
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    expect_same(parse_in_pieces(bytes), whole, "byte by byte: " + text);
  }
}

}  // namespace
}  // namespace g4
