// The two demo models of the tests (docs/DESIGN.md §6, "Demo model"):
// - the embedded demo, models/demo.gguf, the model `g4 run`, `g4 chat` and `g4 serve` use without
//   --model_path (the chat and tool-call demo);
// - the fortune demo, the earlier embedded model, kept as a fixture: its Hugging Face checkpoint
//   (tests/fixtures/demo/hf) is the source of the oracles in tests/fixtures/demo (transformers'
//   logits, golden.json) and of llama.cpp's goldens (tests/fixtures/llamacpp), and the engine
//   tests' prompts, windows and context lengths were written for it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace g4::test {

// models/demo.gguf: the bytes linked into g4.
std::string embedded_demo_path();

// g4's bf16 sampling export of tests/fixtures/demo/hf, exactly what models/demo.gguf was while the
// fortune demo was embedded; exported once per test process into its temp_dir.
const std::string& fortune_demo_path();

// A copy of the fortune demo in which the embedding row of `token` is NaN: a real fault, so that a
// sequence that reads the token gets NaN logits (it fails alone). The demo ties its LM
// head to the embedding; the copy stores the clean embedding as its own LM head (output.weight), so
// the token's logit, which every sequence computes, stays finite. Written to a fresh temp_dir.
std::string nan_embedding_demo_path(int32_t token);

// The fortune demo on an engine whose KV budget holds `sequences` sequences of max_seq_len
// positions: the engine of the session and scheduler tests. max_batch_sequences: the sequences one
// forward samples (0: EngineOptions' default).
std::unique_ptr<Engine> demo_engine_for(int64_t sequences, int64_t max_seq_len, const std::string& backend = "cpu",
                                        const std::string& model_path = fortune_demo_path(),
                                        int64_t max_batch_sequences = 0);

// A prompt of n ids: BOS, then ids spread over the fortune demo's vocabulary from `first` on
// (different `first`, different prompts).
std::vector<int32_t> demo_prompt(int32_t first, int n);

}  // namespace g4::test
