// Small helpers shared by the g4 sub-commands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::cli {

// Parses "1,2,3" into ids; throws g4::Error naming the bad element.
std::vector<int32_t> parse_id_list(const std::string& text);

// The bytes of a file named on the command line; "-" reads standard input to its end.
std::string read_input(const std::string& path);

}  // namespace g4::cli
