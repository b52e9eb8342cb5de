// The demo model (models/demo.gguf) on an engine whose KV budget holds `sequences` sequences of
// max_seq_len positions: the engine of the session and scheduler tests.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/engine.h"

namespace g4::test {

std::unique_ptr<Engine> demo_engine_for(int64_t sequences, int64_t max_seq_len, const std::string& backend = "cpu");

}  // namespace g4::test
