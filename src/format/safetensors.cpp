#include "format/safetensors.h"

#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace g4 {

using nlohmann::json;

namespace {

size_t element_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v, size_t data_size) {
  const std::string where = "'" + path + "': tensor '" + name + "'";
  G4_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
           "malformed safetensors header in " + where + " (needs dtype, shape, data_offsets)");
  SafetensorsEntry e;
  try {
    e.dtype = v["dtype"].get<std::string>();
    e.shape = v["shape"].get<std::vector<int64_t>>();
    auto offsets = v["data_offsets"].get<std::vector<uint64_t>>();
    G4_CHECK(offsets.size() == 2, "malformed safetensors header in " + where + ": data_offsets needs 2 values");
    e.begin = offsets[0];
    e.end = offsets[1];
  } catch (const json::exception&) {
    throw Error("malformed safetensors header in " + where);
  }
  const size_t elem = element_size(e.dtype);
  G4_CHECK(elem > 0, "unknown safetensors dtype '" + e.dtype + "' in " + where);
  uint64_t count = 1;
  for (int64_t d : e.shape) {
    G4_CHECK(d >= 0 && (d == 0 || count <= std::numeric_limits<uint64_t>::max() / uint64_t(d) / 8),
             "bad shape in " + where);
    count *= uint64_t(d);
  }
  G4_CHECK(e.begin <= e.end && e.end <= data_size,
           "tensor data out of range in " + where + ": offsets [" + std::to_string(e.begin) + ", " +
               std::to_string(e.end) + ") but the data section has " + std::to_string(data_size) +
               " bytes (truncated file?)");
  G4_CHECK(e.end - e.begin == count * elem, "tensor size mismatch in " + where + ": shape needs " +
                                                std::to_string(count * elem) + " bytes, offsets give " +
                                                std::to_string(e.end - e.begin));
  return e;
}

const char* dtype_string(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::TQ4: break;  // block formats have no safetensors dtype
  }
  throw Error(ErrorKind::kUnsupported, "safetensors cannot store " + dtype_name(t));
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(MappedFile::open(path)) {
  const size_t size = file_->size();
  G4_CHECK(size >= 8, "truncated safetensors file '" + path + "' (" + std::to_string(size) + " bytes)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_->data(), 8);
  G4_CHECK(header_len <= size - 8, "truncated safetensors file '" + path + "': header of " +
                                       std::to_string(header_len) + " bytes but the file has " +
                                       std::to_string(size) + " bytes");
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(file_->data()) + 8,
                         reinterpret_cast<const char*>(file_->data()) + 8 + header_len);
  } catch (const json::parse_error& e) {
    throw Error("malformed safetensors header in '" + path + "': " + e.what());
  }
  G4_CHECK(header.is_object(), "malformed safetensors header in '" + path + "': not an object");
  data_offset_ = 8 + header_len;
  const size_t data_size = size - data_offset_;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    entries_.emplace(name, parse_entry(path, name, v, data_size));
  }
}

DType safetensors_dtype(const std::string& dtype, const std::string& tensor_name) {
  if (dtype == "F32") return DType::F32;
  if (dtype == "BF16") return DType::BF16;
  if (dtype == "F16") return DType::F16;
  throw Error(ErrorKind::kUnsupported, "tensor '" + tensor_name + "' has unsupported dtype " + dtype + " (supported: F32, BF16, F16)");
}

HostTensor SafetensorsFile::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  G4_CHECK(it != entries_.end(), "tensor '" + name + "' not in '" + path() + "'");
  const SafetensorsEntry& e = it->second;
  HostTensor t;
  t.name = name;
  t.dtype = safetensors_dtype(e.dtype, name);
  t.shape = e.shape;
  t.data = file_->data() + data_offset_ + e.begin;
  t.bytes = e.end - e.begin;
  t.owner = file_;
  return t;
}

void write_safetensors(const std::string& path, const std::vector<HostTensor>& tensors) {
  json header = json::object();
  size_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", dtype_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  G4_CHECK(out.good(), "cannot write '" + path + "'");
  uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& t : tensors) out.write(static_cast<const char*>(t.data), std::streamsize(t.bytes));
  G4_CHECK(out.good(), "failed writing '" + path + "'");
}

}  // namespace g4
