// GGUF v3 (llama.cpp's model file format): a memory-mapped reader that validates every length,
// count and offset before using it, and a streaming writer that never holds more than the caller's
// current chunk of tensor data.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 metadata_count, the metadata
// (string key, u32 value type, value), the tensor infos (string name, u32 n_dims, u64 dims[n_dims],
// u32 ggml type, u64 offset), padding to the alignment (`general.alignment`, default 32), then the
// tensor data; each tensor's offset is relative to the data section and aligned.
// Strings are u64 length + bytes; arrays are u32 element type + u64 count + elements.
//
// Dimensions are stored innermost first (dims[0] is the contiguous one, ggml's ne[0]); g4's
// HostTensor shape is outermost first, so a linear weight [out, in] has GGUF dims [in, out].
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "format/tensor_source.h"

namespace g4 {

class MappedFile;

// The numbering is GGUF's.
enum class GgufType : uint32_t { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

std::string gguf_type_name(GgufType t);

class GgufValue;

// A metadata array: one element type (nested arrays are not supported), elements as values.
struct GgufArray {
  GgufType element_type = GgufType::U8;
  std::vector<GgufValue> items;
};

// One metadata value. The variant's alternative index equals the GgufType number, so the type
// travels with the value and a round trip keeps it.
class GgufValue {
 public:
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                               GgufArray, uint64_t, int64_t, double>;
  GgufValue() = default;
  // Only the exact alternative types convert (GgufValue(uint32_t(5)) is a U32), so the GGUF type
  // of a value is always the one the caller wrote.
  template <typename T>
    requires(std::is_constructible_v<Storage, std::in_place_type_t<std::decay_t<T>>, T>)
  GgufValue(T&& v) : value_(std::in_place_type<std::decay_t<T>>, std::forward<T>(v)) {}
  GgufValue(const char* text) : value_(std::in_place_type<std::string>, text) {}

  GgufType type() const { return GgufType(value_.index()); }
  const Storage& storage() const { return value_; }
  bool operator==(const GgufValue& other) const;

  // Conversions that throw g4::Error naming `what` (the key) when the type does not fit.
  int64_t to_int(const std::string& what) const;  // any integer type (u64 above INT64_MAX throws)
  double to_float(const std::string& what) const;  // F32 or F64
  bool to_bool(const std::string& what) const;
  const std::string& to_string(const std::string& what) const;
  const GgufArray& to_array(const std::string& what) const;

  static GgufValue array(GgufType element_type, std::vector<GgufValue> items);
  template <typename T>
  static GgufValue array_of(const std::vector<T>& values) {
    std::vector<GgufValue> items;
    items.reserve(values.size());
    for (const T& v : values) items.emplace_back(T(v));
    return array(GgufValue(T{}).type(), std::move(items));
  }

 private:
  Storage value_;
};

inline bool operator==(const GgufArray& a, const GgufArray& b) {
  return a.element_type == b.element_type && a.items == b.items;
}

// Metadata in file order, unique keys.
class GgufMetadata {
 public:
  void set(const std::string& key, GgufValue value);  // replaces an existing key in place
  const GgufValue* find(const std::string& key) const;
  const std::vector<std::pair<std::string, GgufValue>>& entries() const { return entries_; }

  // Typed access; throws g4::Error naming the key when it is missing or has another type.
  const GgufValue& get(const std::string& key) const;
  int64_t get_int(const std::string& key) const { return get(key).to_int(key); }
  double get_float(const std::string& key) const { return get(key).to_float(key); }
  bool get_bool(const std::string& key) const { return get(key).to_bool(key); }
  const std::string& get_string(const std::string& key) const { return get(key).to_string(key); }
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<bool> get_bool_array(const std::string& key) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> entries_;
  std::map<std::string, size_t> index_;  // key -> position in entries_
};

// ggml's tensor type numbers for the types g4 stores.
// ggml's type ids (ggml.h) for the types g4 reads.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30
};

GgmlType ggml_type_of(DType t);  // throws for dtypes GGUF tensors cannot hold in g4
std::string ggml_type_name(uint32_t ggml_type);

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxDims = 4;

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF order: dims[0] is the innermost (contiguous) dimension
  DType dtype = DType::F32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t bytes = 0;

  std::vector<int64_t> shape() const;  // outermost first (dims reversed)
};

class GgufFile {
 public:
  // Maps and validates the file; throws g4::Error naming the file and the problem.
  explicit GgufFile(const std::string& path);
  // Parses bytes held in memory (`name` is used in messages).
  GgufFile(std::shared_ptr<const std::vector<uint8_t>> bytes, const std::string& name);
  // Parses bytes in memory that `owner` keeps alive; a null owner means the bytes live as long as
  // the program (e.g. a model linked into the executable). Tensors point into the bytes, no copy.
  GgufFile(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner, const std::string& name);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // The tensor's bytes in the file, shape outermost first; `owner` keeps the file alive.
  HostTensor tensor(const GgufTensorInfo& info) const;

 private:
  GgufFile(std::shared_ptr<const MappedFile> file, const std::string& name);
  void parse();

  std::string name_;
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0, alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;  // name -> position in tensors_
};

// What the writer will store for one tensor: name, shape outermost first, dtype.
struct GgufTensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
};

// Writes `path` by streaming: the constructor writes the header, the metadata and the tensor
// table (alignment from the metadata's `general.alignment`, default 32); append() then takes each
// tensor's data in plan order, in pieces of any size, and pads between tensors; finish() flushes
// and renames. Until finish() succeeds the data lives in a temporary file beside `path`, unique to
// this writer (unique_temporary_name), which the destructor removes, so a failed export never
// leaves a partial file under `path` and two writers of one path never share a file.
class GgufWriter {
 public:
  GgufWriter(const std::string& path, const GgufMetadata& metadata, std::vector<GgufTensorPlan> plan);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Bytes of the current tensor; throws when they would run past its end or past the last tensor.
  void append(const void* data, size_t bytes);
  // Name of the tensor append() fills next ("" when all are complete).
  std::string current_tensor() const;
  // Total bytes written; throws unless every tensor is complete.
  uint64_t finish();

 private:
  void write(const void* data, size_t bytes);
  void pad_to_alignment();
  void discard();  // closes and removes the temporary file

  std::string path_, tmp_path_;
  std::ofstream out_;
  std::vector<GgufTensorPlan> plan_;
  std::vector<uint64_t> tensor_bytes_;
  uint32_t alignment_ = kGgufDefaultAlignment;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0, position_ = 0;
  bool finished_ = false;
};

}  // namespace g4
