// Whole-file reads with errors that name the file.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace g4 {

// The file's bytes; throws g4::Error "cannot read '<path>'" (also for a directory).
std::string read_file(const std::string& path);
// As read_file, but nullopt when the file does not exist.
std::optional<std::string> read_file_if_exists(const std::string& path);
// The file parsed as JSON; throws g4::Error "malformed JSON in '<path>': ..." on a parse error.
nlohmann::json read_json_file(const std::string& path);
// A name beside `path` that no other writer uses (process id and a per-process counter): write
// there, then rename onto `path`, so that concurrent writers of one path never share a file.
std::string unique_temporary_name(const std::string& path);

}  // namespace g4
