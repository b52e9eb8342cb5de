#include "format/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "util/error.h"
#include "util/files.h"
#include "util/mapped_file.h"

namespace g4 {

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kWrittenVersion = 3;

// Bytes of one scalar value in the file (0 for strings and arrays, whose size varies).
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL: return 1;
    case GgufType::U16:
    case GgufType::I16: return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32: return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64: return 8;
    case GgufType::STRING:
    case GgufType::ARRAY: return 0;
  }
  return 0;
}

// The least number of bytes a value of type t occupies; bounds counts before anything is allocated.
size_t min_encoded_size(GgufType t) {
  if (t == GgufType::STRING) return 8;
  if (t == GgufType::ARRAY) return 12;
  return scalar_size(t);
}

bool valid_type(uint32_t t) { return t <= uint32_t(GgufType::F64); }

// A bounds-checked cursor over the file's bytes; every read names what it was reading on failure.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  size_t position() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("malformed GGUF file '" + file_ + "' at byte " + std::to_string(pos_) + ": " + what);
  }

  void need(uint64_t bytes, const std::string& what) const {
    if (bytes > remaining())
      fail("truncated " + what + " (needs " + std::to_string(bytes) + " bytes, " + std::to_string(remaining()) +
           " left)");
  }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const uint64_t length = read<uint64_t>(what + " length");
    need(length, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(length));
    pos_ += size_t(length);
    return s;
  }

  // A count of items that each take at least min_item_bytes: absurd counts fail here, before any
  // allocation sized by them.
  uint64_t read_count(const std::string& what, size_t min_item_bytes) {
    const uint64_t count = read<uint64_t>(what);
    if (min_item_bytes > 0 && count > remaining() / min_item_bytes)
      fail(what + " " + std::to_string(count) + " is impossible: " + std::to_string(remaining()) +
           " bytes are left");
    return count;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
};

GgufValue read_scalar(Cursor& in, GgufType t, const std::string& what) {
  switch (t) {
    case GgufType::U8: return in.read<uint8_t>(what);
    case GgufType::I8: return in.read<int8_t>(what);
    case GgufType::U16: return in.read<uint16_t>(what);
    case GgufType::I16: return in.read<int16_t>(what);
    case GgufType::U32: return in.read<uint32_t>(what);
    case GgufType::I32: return in.read<int32_t>(what);
    case GgufType::F32: return in.read<float>(what);
    case GgufType::BOOL: {
      const uint8_t b = in.read<uint8_t>(what);
      if (b > 1) in.fail(what + ": bool value " + std::to_string(b) + " is neither 0 nor 1");
      return b == 1;
    }
    case GgufType::STRING: return in.read_string(what);
    case GgufType::U64: return in.read<uint64_t>(what);
    case GgufType::I64: return in.read<int64_t>(what);
    case GgufType::F64: return in.read<double>(what);
    case GgufType::ARRAY: break;
  }
  in.fail(what + ": unexpected array");
}

GgufValue read_value(Cursor& in, GgufType t, const std::string& what) {
  if (t != GgufType::ARRAY) return read_scalar(in, t, what);
  const uint32_t element = in.read<uint32_t>(what + " element type");
  if (!valid_type(element)) in.fail(what + ": unknown array element type " + std::to_string(element));
  if (GgufType(element) == GgufType::ARRAY) in.fail(what + ": nested arrays are not supported");
  const uint64_t count = in.read_count(what + " element count", min_encoded_size(GgufType(element)));
  std::vector<GgufValue> items;
  items.reserve(size_t(count));
  for (uint64_t i = 0; i < count; ++i) items.push_back(read_scalar(in, GgufType(element), what));
  return GgufValue::array(GgufType(element), std::move(items));
}

void write_scalar(std::string& out, const GgufValue& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          const uint64_t length = x.size();
          out.append(reinterpret_cast<const char*>(&length), 8);
          out.append(x);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          const uint32_t element = uint32_t(x.element_type);
          const uint64_t count = x.items.size();
          out.append(reinterpret_cast<const char*>(&element), 4);
          out.append(reinterpret_cast<const char*>(&count), 8);
          for (const GgufValue& item : x.items) write_scalar(out, item);
        } else if constexpr (std::is_same_v<T, bool>) {
          out.push_back(x ? 1 : 0);
        } else {
          out.append(reinterpret_cast<const char*>(&x), sizeof(T));
        }
      },
      v.storage());
}

void append_string(std::string& out, const std::string& s) { write_scalar(out, GgufValue(s)); }

template <typename T>
void append_pod(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

DType dtype_of_ggml(uint32_t ggml_type, const std::string& tensor) {
  switch (GgmlType(ggml_type)) {
    case GgmlType::F32: return DType::F32;
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    case GgmlType::Q8_0: return DType::Q8_0;
    case GgmlType::Q4_0: return DType::Q4_0;
    case GgmlType::Q4_1: return DType::Q4_1;
    case GgmlType::Q5_0: return DType::Q5_0;
    case GgmlType::Q5_1: return DType::Q5_1;
    case GgmlType::Q4_K: return DType::Q4_K;
    case GgmlType::Q5_K: return DType::Q5_K;
    case GgmlType::Q6_K: return DType::Q6_K;
  }
  throw Error(ErrorKind::kUnsupported, "tensor '" + tensor + "' has GGML type " + ggml_type_name(ggml_type) +
              ", which g4 does not support (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, "
              "Q5_K, Q6_K)");
}

// Bytes of a tensor with GGUF dims, or a clear error on overflow or a partial block.
uint64_t tensor_bytes(const std::vector<uint64_t>& dims, DType dtype, const std::string& tensor) {
  const uint64_t limit = uint64_t(std::numeric_limits<int64_t>::max());
  uint64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) {
    G4_CHECK(rows <= limit / dims[i], "tensor '" + tensor + "': dimensions overflow");
    rows *= dims[i];
  }
  G4_CHECK(dims[0] % uint64_t(block_size(dtype)) == 0,
           "tensor '" + tensor + "': " + dtype_name(dtype) + " needs its innermost dimension to be a multiple of " +
               std::to_string(block_size(dtype)) + ", got " + std::to_string(dims[0]));
  G4_CHECK(dims[0] <= limit / 8, "tensor '" + tensor + "': dimensions overflow");
  const uint64_t row = row_bytes(dtype, int64_t(dims[0]));
  G4_CHECK(row == 0 || rows <= limit / row, "tensor '" + tensor + "': dimensions overflow");
  return rows * row;
}

}  // namespace

std::string gguf_type_name(GgufType t) {
  static const char* names[] = {"U8",  "I8",   "U16",    "I16",   "U32", "I32", "F32",
                                "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};
  return uint32_t(t) <= uint32_t(GgufType::F64) ? names[uint32_t(t)] : "type " + std::to_string(uint32_t(t));
}

bool GgufValue::operator==(const GgufValue& other) const { return value_ == other.value_; }

int64_t GgufValue::to_int(const std::string& what) const {
  return std::visit(
      [&](const auto& x) -> int64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          constexpr bool may_overflow = std::is_same_v<T, uint64_t>;
          if (may_overflow && uint64_t(x) > uint64_t(std::numeric_limits<int64_t>::max()))
            throw Error("GGUF metadata '" + what + "' is too large");
          return int64_t(x);
        } else {
          throw Error("GGUF metadata '" + what + "' is " + gguf_type_name(type()) + ", expected an integer");
        }
      },
      value_);
}

double GgufValue::to_float(const std::string& what) const {
  if (const float* f = std::get_if<float>(&value_)) return *f;
  if (const double* d = std::get_if<double>(&value_)) return *d;
  throw Error("GGUF metadata '" + what + "' is " + gguf_type_name(type()) + ", expected F32 or F64");
}

bool GgufValue::to_bool(const std::string& what) const {
  if (const bool* b = std::get_if<bool>(&value_)) return *b;
  throw Error("GGUF metadata '" + what + "' is " + gguf_type_name(type()) + ", expected BOOL");
}

const std::string& GgufValue::to_string(const std::string& what) const {
  if (const std::string* s = std::get_if<std::string>(&value_)) return *s;
  throw Error("GGUF metadata '" + what + "' is " + gguf_type_name(type()) + ", expected STRING");
}

const GgufArray& GgufValue::to_array(const std::string& what) const {
  if (const GgufArray* a = std::get_if<GgufArray>(&value_)) return *a;
  throw Error("GGUF metadata '" + what + "' is " + gguf_type_name(type()) + ", expected ARRAY");
}

GgufValue GgufValue::array(GgufType element_type, std::vector<GgufValue> items) {
  G4_CHECK(element_type != GgufType::ARRAY, "GGUF: nested arrays are not supported");
  for (const GgufValue& item : items)
    G4_CHECK(item.type() == element_type, "GGUF array of " + gguf_type_name(element_type) + " holds a " +
                                              gguf_type_name(item.type()));
  return GgufValue(GgufArray{element_type, std::move(items)});
}

void GgufMetadata::set(const std::string& key, GgufValue value) {
  auto [it, inserted] = index_.emplace(key, entries_.size());
  if (inserted) {
    entries_.emplace_back(key, std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
}

const GgufValue* GgufMetadata::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const GgufValue& GgufMetadata::get(const std::string& key) const {
  const GgufValue* v = find(key);
  G4_CHECK(v, "GGUF metadata '" + key + "' is missing");
  return *v;
}

std::vector<int64_t> GgufMetadata::get_int_array(const std::string& key) const {
  std::vector<int64_t> out;
  for (const GgufValue& item : get(key).to_array(key).items) out.push_back(item.to_int(key));
  return out;
}

std::vector<bool> GgufMetadata::get_bool_array(const std::string& key) const {
  std::vector<bool> out;
  for (const GgufValue& item : get(key).to_array(key).items) out.push_back(item.to_bool(key));
  return out;
}

GgmlType ggml_type_of(DType t) {
  switch (t) {
    case DType::F32: return GgmlType::F32;
    case DType::F16: return GgmlType::F16;
    case DType::BF16: return GgmlType::BF16;
    case DType::Q8_0: return GgmlType::Q8_0;
    case DType::Q4_0: return GgmlType::Q4_0;
    case DType::Q4_1: return GgmlType::Q4_1;
    case DType::Q5_0: return GgmlType::Q5_0;
    case DType::Q5_1: return GgmlType::Q5_1;
    case DType::Q4_K: return GgmlType::Q4_K;
    case DType::Q5_K: return GgmlType::Q5_K;
    case DType::Q6_K: return GgmlType::Q6_K;
    default: throw Error(ErrorKind::kUnsupported, "g4 does not store " + dtype_name(t) + " tensors in GGUF files");
  }
}

std::string ggml_type_name(uint32_t ggml_type) {
  // ggml's numbering (ggml.h); gaps are types ggml removed.
  static const char* names[] = {"F32",  "F16",  "Q4_0", "Q4_1",    "",        "",       "Q5_0",  "Q5_1",
                                "Q8_0", "Q8_1", "Q2_K", "Q3_K",    "Q4_K",    "Q5_K",   "Q6_K",  "Q8_K",
                                "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                "I8",   "I16",  "I32",  "I64",     "F64",     "IQ1_M",  "BF16"};
  const std::string number = std::to_string(ggml_type);
  if (ggml_type < std::size(names) && names[ggml_type][0] != '\0') return number + " (" + names[ggml_type] + ")";
  return number + " (unknown)";
}

std::vector<int64_t> GgufTensorInfo::shape() const {
  std::vector<int64_t> s;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) s.push_back(int64_t(*it));
  return s;
}

namespace {
std::span<const uint8_t> bytes_of(const MappedFile& file) { return {file.data(), file.size()}; }
}  // namespace

// Every source of bytes (a mapped file, a vector, memory the caller owns) is parsed by one path.
GgufFile::GgufFile(const std::string& path) : GgufFile(MappedFile::open(path), path) {}

GgufFile::GgufFile(std::shared_ptr<const MappedFile> file, const std::string& name)
    : GgufFile(bytes_of(*file), file, name) {}

GgufFile::GgufFile(std::shared_ptr<const std::vector<uint8_t>> bytes, const std::string& name)
    : GgufFile(std::span<const uint8_t>(*bytes), bytes, name) {}

GgufFile::GgufFile(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner, const std::string& name)
    : name_(name), owner_(std::move(owner)), data_(bytes.data()), size_(bytes.size()) {
  parse();
}

void GgufFile::parse() {
  Cursor in(data_, size_, name_);
  in.need(4, "header (not a GGUF file?)");
  if (std::memcmp(data_, kMagic, 4) != 0) in.fail("bad magic: not a GGUF file");
  in.read<uint32_t>("magic");
  version_ = in.read<uint32_t>("version");
  // Version 2 has version 3's layout (3 only added big-endian files, which read as a wrong version).
  if (version_ != 2 && version_ != 3)
    in.fail("unsupported GGUF version " + std::to_string(version_) + " (g4 reads versions 2 and 3)");
  const uint64_t tensor_count = in.read<uint64_t>("tensor count");
  const uint64_t metadata_count = in.read_count("metadata count", 8 + 4 + 1);

  for (uint64_t i = 0; i < metadata_count; ++i) {
    std::string key = in.read_string("metadata key");
    if (metadata_.find(key)) in.fail("duplicate metadata key '" + key + "'");
    const uint32_t type = in.read<uint32_t>("type of '" + key + "'");
    if (!valid_type(type)) in.fail("metadata '" + key + "' has unknown type " + std::to_string(type));
    metadata_.set(key, read_value(in, GgufType(type), "metadata '" + key + "'"));
  }
  if (const GgufValue* a = metadata_.find("general.alignment")) {
    const uint32_t* alignment = std::get_if<uint32_t>(&a->storage());
    if (!alignment || !is_power_of_two(*alignment))
      in.fail("general.alignment must be a U32 power of two");
    alignment_ = *alignment;
  }

  // A tensor info takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes.
  if (tensor_count > in.remaining() / 32)
    in.fail("tensor count " + std::to_string(tensor_count) + " is impossible: " + std::to_string(in.remaining()) +
            " bytes are left");
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = in.read_string("tensor name");
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) in.fail("duplicate tensor '" + t.name + "'");
    const uint32_t n_dims = in.read<uint32_t>("dimension count of '" + t.name + "'");
    if (n_dims < 1 || n_dims > kGgufMaxDims)
      in.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    for (uint32_t d = 0; d < n_dims; ++d) {
      t.dims.push_back(in.read<uint64_t>("dimensions of '" + t.name + "'"));
      if (t.dims.back() == 0 || t.dims.back() > uint64_t(std::numeric_limits<int64_t>::max()))
        in.fail("tensor '" + t.name + "' has dimension " + std::to_string(t.dims.back()));
    }
    t.dtype = dtype_of_ggml(in.read<uint32_t>("type of '" + t.name + "'"), t.name);
    t.offset = in.read<uint64_t>("offset of '" + t.name + "'");
    t.bytes = tensor_bytes(t.dims, t.dtype, t.name);
    if (t.offset % alignment_ != 0)
      in.fail("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
              std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }

  data_offset_ = align_up(in.position(), alignment_);
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (const GgufTensorInfo& t : tensors_)
    G4_CHECK(t.offset <= data_size && t.bytes <= data_size - t.offset,
             "malformed GGUF file '" + name_ + "': tensor '" + t.name + "' data [" + std::to_string(t.offset) +
                 ", +" + std::to_string(t.bytes) + ") runs past the end of the file (data section has " +
                 std::to_string(data_size) + " bytes; truncated?)");
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    G4_CHECK(by_offset[i]->offset >= by_offset[i - 1]->offset + by_offset[i - 1]->bytes,
             "malformed GGUF file '" + name_ + "': tensors '" + by_offset[i - 1]->name + "' and '" +
                 by_offset[i]->name + "' overlap");
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

HostTensor GgufFile::tensor(const GgufTensorInfo& info) const {
  HostTensor t;
  t.name = info.name;
  t.dtype = info.dtype;
  t.shape = info.shape();
  t.data = data_ + data_offset_ + info.offset;
  t.bytes = size_t(info.bytes);
  t.owner = std::const_pointer_cast<void>(owner_);
  return t;
}

GgufWriter::GgufWriter(const std::string& path, const GgufMetadata& metadata, std::vector<GgufTensorPlan> plan)
    : path_(path), tmp_path_(unique_temporary_name(path)), plan_(std::move(plan)) {
  if (const GgufValue* a = metadata.find("general.alignment")) {
    const uint32_t* alignment = std::get_if<uint32_t>(&a->storage());
    G4_CHECK(alignment && is_power_of_two(*alignment), "general.alignment must be a U32 power of two");
    alignment_ = *alignment;
  }
  std::string header(kMagic, 4);
  append_pod(header, kWrittenVersion);
  append_pod(header, uint64_t(plan_.size()));
  append_pod(header, uint64_t(metadata.entries().size()));
  for (const auto& [key, value] : metadata.entries()) {
    append_string(header, key);
    append_pod(header, uint32_t(value.type()));
    write_scalar(header, value);
  }
  uint64_t offset = 0;
  for (const GgufTensorPlan& t : plan_) {
    G4_CHECK(!t.shape.empty() && t.shape.size() <= kGgufMaxDims,
             "tensor '" + t.name + "' has " + std::to_string(t.shape.size()) + " dimensions (1 to 4 allowed)");
    std::vector<uint64_t> dims;
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {
      G4_CHECK(*it > 0, "tensor '" + t.name + "' has a non-positive dimension");
      dims.push_back(uint64_t(*it));
    }
    const uint64_t bytes = tensor_bytes(dims, t.dtype, t.name);
    append_string(header, t.name);
    append_pod(header, uint32_t(dims.size()));
    for (uint64_t d : dims) append_pod(header, d);
    append_pod(header, uint32_t(ggml_type_of(t.dtype)));
    append_pod(header, offset);
    tensor_bytes_.push_back(bytes);
    offset = align_up(offset + bytes, alignment_);
  }
  out_.open(tmp_path_, std::ios::binary | std::ios::trunc);
  G4_CHECK(out_.good(), "cannot write '" + tmp_path_ + "'");
  try {
    write(header.data(), header.size());
    pad_to_alignment();
  } catch (const Error&) {
    discard();  // the destructor does not run when the constructor throws
    throw;
  }
}

GgufWriter::~GgufWriter() {
  if (!finished_) discard();
}

void GgufWriter::discard() {
  out_.close();
  std::error_code ignored;
  std::filesystem::remove(tmp_path_, ignored);
}

void GgufWriter::write(const void* data, size_t bytes) {
  out_.write(static_cast<const char*>(data), std::streamsize(bytes));
  G4_CHECK(out_.good(), "failed writing '" + tmp_path_ + "' (disk full?)");
  position_ += bytes;
}

void GgufWriter::pad_to_alignment() {
  static const char zeros[256] = {};
  uint64_t padding = align_up(position_, alignment_) - position_;
  while (padding > 0) {
    const size_t n = size_t(std::min<uint64_t>(padding, sizeof(zeros)));
    write(zeros, n);
    padding -= n;
  }
}

std::string GgufWriter::current_tensor() const { return current_ < plan_.size() ? plan_[current_].name : ""; }

void GgufWriter::append(const void* data, size_t bytes) {
  G4_CHECK(current_ < plan_.size(), "GGUF writer: data past the last tensor");
  const uint64_t left = tensor_bytes_[current_] - written_in_current_;
  G4_CHECK(bytes <= left, "GGUF writer: " + std::to_string(bytes) + " bytes for tensor '" + plan_[current_].name +
                              "', which has " + std::to_string(left) + " bytes left");
  write(data, bytes);
  written_in_current_ += bytes;
  if (written_in_current_ == tensor_bytes_[current_]) {
    pad_to_alignment();
    ++current_;
    written_in_current_ = 0;
  }
}

uint64_t GgufWriter::finish() {
  G4_CHECK(current_ == plan_.size(), "GGUF writer: tensor '" + current_tensor() + "' is incomplete");
  out_.close();
  G4_CHECK(!out_.fail(), "failed writing '" + tmp_path_ + "'");
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  G4_CHECK(!ec, "cannot rename '" + tmp_path_ + "' to '" + path_ + "': " + ec.message());
  finished_ = true;
  return position_;
}

}  // namespace g4
