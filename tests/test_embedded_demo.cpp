// The demo model linked into g4: a GGUF read from memory is the same model as the mapped file, and
// the g4 binary alone (copied elsewhere, run from /) runs it without --model_path. Its MTP assistant,
// linked in beside it, drafts the demo's own greedy text and keeps most of its drafts on a chat.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "format/gguf.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "support/fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

const std::string kDemo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";

// The demo file's bytes, alive for the whole test program like the bytes linked into g4.
const std::vector<uint8_t>& demo_bytes() {
  static const std::vector<uint8_t> bytes = [] {
    std::ifstream in(kDemo, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  return bytes;
}

TEST(EmbeddedDemo, GgufFromMemoryReadsLikeTheMappedFile) {
  const std::vector<uint8_t>& bytes = demo_bytes();
  ASSERT_GT(bytes.size(), 0u);
  const GgufFile mapped(kDemo), memory(std::span<const uint8_t>(bytes), nullptr, "demo bytes");
  EXPECT_EQ(memory.name(), "demo bytes");
  EXPECT_EQ(memory.version(), mapped.version());
  EXPECT_EQ(memory.data_offset(), mapped.data_offset());
  EXPECT_TRUE(memory.metadata().entries() == mapped.metadata().entries());
  ASSERT_EQ(memory.tensors().size(), mapped.tensors().size());
  for (size_t i = 0; i < mapped.tensors().size(); ++i) {
    const HostTensor a = mapped.tensor(mapped.tensors()[i]), b = memory.tensor(memory.tensors()[i]);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.shape, a.shape);
    EXPECT_EQ(b.dtype, a.dtype);
    ASSERT_EQ(b.bytes, a.bytes);
    // No copy: the tensor points into the caller's bytes.
    const auto* p = static_cast<const uint8_t*>(b.data);
    EXPECT_TRUE(p >= bytes.data() && p + b.bytes <= bytes.data() + bytes.size()) << b.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes), 0) << b.name;
  }
}

TEST(EmbeddedDemo, EngineFromAModelImageGeneratesLikeTheFile) {
  EngineOptions from_file, from_memory;
  from_file.model_path = kDemo;
  from_memory.model_image = ModelImage{demo_bytes(), "demo bytes"};
  Engine a(from_file), b(from_memory);
  EXPECT_EQ(b.tokenizer_json(), a.tokenizer_json());
  GenerationRequest r;
  r.prompt = {2, 105, 2364, 107};
  r.sampler = Sampler(SamplingParams{.temperature = 0.0f});
  r.max_new_tokens = 12;
  r.stop_ids = {};
  EXPECT_EQ(generate(*b.create_session(), r).tokens, generate(*a.create_session(), r).tokens);
}

// The trained assistant (tools/demo/train_assistant.py) on a held-out-style chat: drafted greedy text
// is the demo's own, token for token, and a round keeps most of its four drafts (about 4.6 tokens a
// round on the training run's held-out chats; an assistant that read the wrong caches or hidden
// states would keep almost none).
TEST(EmbeddedDemo, AssistantDraftsTheDemosOwnTextAndKeepsMostDrafts) {
  EngineOptions plain_options, drafting_options;
  plain_options.model_path = drafting_options.model_path = kDemo;
  drafting_options.draft_model = std::string(G4_SOURCE_DIR) + "/models/demo-assistant.gguf";
  Engine plain(plain_options), drafting(drafting_options);
  ASSERT_EQ(drafting.draft_options().draft_tokens, 4);  // the assistant's num_assistant_tokens
  const Tokenizer tokenizer = Tokenizer::from_json(*plain.tokenizer_json());
  GenerationRequest r;
  r.prompt = tokenizer.encode(format_gemma4_prompt("What is the capital of Germany?"), true);
  r.sampler = Sampler(SamplingParams{.temperature = 0.0f});
  r.max_new_tokens = 48;
  r.stop_ids = {};  // past the reply, into the turns the demo writes next
  const std::vector<int32_t> want = generate(*plain.create_session(), r).tokens;
  r.draft = drafting.draft_options();
  std::unique_ptr<Session> session = drafting.create_session();
  EXPECT_EQ(generate(*session, r).tokens, want);
  const SpeculationStats* stats = session->speculation_stats();
  ASSERT_NE(stats, nullptr);
  EXPECT_GE(stats->tokens_per_round(), 3.0) << stats->accepted << " of " << stats->drafted << " drafts in "
                                            << stats->rounds << " rounds";
}

TEST(EmbeddedDemo, CopiedBinaryRunsTheDemoFromRoot) {
  const std::filesystem::path copy = std::filesystem::path(test::temp_dir("embedded-demo")) / "g4";
  std::filesystem::copy_file(G4_BINARY, copy);
  std::string out;
  ASSERT_EQ(test::run_command("cd / && '" + copy.string() + "' run --prompt hi --seed 1 --max_new_tokens 8", &out), 0)
      << out;
  EXPECT_NE(out.find("--- report ---"), std::string::npos) << out;
}

}  // namespace
}  // namespace g4
