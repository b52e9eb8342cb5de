// Small helpers shared by the g4 sub-commands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/loader.h"
#include "runtime/engine.h"

namespace g4::cli {

// The demo model (models/demo.gguf at build time), linked into the g4 executable, so that it runs
// from any directory and from a copied or installed binary.
ModelImage demo_model();
// The model the sub-commands run: `model_path`, or the embedded demo model when it is empty.
void use_model_or_demo(EngineOptions& options, const std::string& model_path);

// Parses "1,2,3" into ids; throws g4::Error naming the bad element.
std::vector<int32_t> parse_id_list(const std::string& text);

// The bytes of a file named on the command line; "-" reads standard input to its end.
std::string read_input(const std::string& path);

}  // namespace g4::cli
