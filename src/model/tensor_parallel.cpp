#include "model/tensor_parallel.h"

#include <cstring>
#include <set>

#include "quant/quantize.h"
#include "util/error.h"

namespace g4 {

namespace {

std::string tp(int size) { return "--tp " + std::to_string(size) + ": "; }

void check_divides(int64_t count, const std::string& what, int size) {
  G4_CHECK(count % size == 0, tp(size) + std::to_string(count) + " " + what + " are not divisible by " +
                                  std::to_string(size));
}

// "layers.12.self_attn.q_proj.weight" → 12 and "self_attn.q_proj.weight"; -1 for a model-wide tensor.
int layer_of(const std::string& name, std::string& rest) {
  if (name.rfind("layers.", 0) != 0) {
    rest = name;
    return -1;
  }
  const size_t dot = name.find('.', 7);
  rest = name.substr(dot + 1);
  return std::stoi(name.substr(7, dot - 7));
}

TensorSlice rows_of(int64_t total, TpShard s) {
  return {TensorSlice::Axis::kRows, total / s.size * s.rank, total / s.size};
}
TensorSlice cols_of(int64_t total, TpShard s) {
  return {TensorSlice::Axis::kCols, total / s.size * s.rank, total / s.size};
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int size) {
  G4_CHECK(size >= 1, "--tp must be at least 1, got " + std::to_string(size));
  if (size == 1) return;
  check_divides(c.num_heads, "query heads", size);
  std::set<std::pair<bool, int>> seen;  // (sliding, kv heads): one message per layer type
  for (const LayerConfig& l : c.layers) {
    if (!seen.insert({l.sliding, l.kv_heads}).second) continue;
    const std::string layers = l.sliding ? "sliding" : "full";
    G4_CHECK(l.kv_heads % size == 0 || size % l.kv_heads == 0,
             tp(size) + "the " + layers + " layers' " + std::to_string(l.kv_heads) +
                 " KV heads are neither divisible by " + std::to_string(size) + " nor a divisor of it");
  }
  check_divides(c.intermediate_size, "MLP columns (intermediate_size)", size);
  check_divides(c.vocab_size, "vocabulary rows of the LM head", size);
}

HeadRange kv_heads_of_rank(int kv_heads, TpShard s) {
  if (s.size <= kv_heads) return {kv_heads / s.size * s.rank, kv_heads / s.size};
  // size / kv_heads ranks share each KV head; a rank's query heads all belong to the group of the
  // KV head with the same position in the head order (docs/DESIGN.md, "Tensor parallel").
  return {s.rank / (s.size / kv_heads), 1};
}

ModelConfig rank_config(const ModelConfig& c, int size) {
  check_tensor_parallel(c, size);
  ModelConfig r = c;
  r.num_heads = c.num_heads / size;
  r.intermediate_size = c.intermediate_size / size;
  for (LayerConfig& l : r.layers) l.kv_heads = kv_heads_of_rank(l.kv_heads, {0, size}).count;
  return r;
}

TensorSlice rank_slice(const ModelConfig& c, const std::string& name, TpShard s) {
  if (!s.split()) return {};
  std::string rest;
  const int layer = layer_of(name, rest);
  if (layer < 0) return name == "lm_head.weight" ? rows_of(c.vocab_size, s) : TensorSlice{};
  const LayerConfig& l = c.layers[size_t(layer)];
  const int64_t q_cols = int64_t(c.num_heads) * l.head_dim;
  if (rest == "self_attn.q_proj.weight") return rows_of(q_cols, s);
  if (rest == "self_attn.k_proj.weight" || rest == "self_attn.v_proj.weight") {
    const HeadRange kv = kv_heads_of_rank(l.kv_heads, s);
    return {TensorSlice::Axis::kRows, int64_t(kv.first) * l.head_dim, int64_t(kv.count) * l.head_dim};
  }
  if (rest == "self_attn.o_proj.weight") return cols_of(q_cols, s);
  if (rest == "mlp.gate_proj.weight" || rest == "mlp.up_proj.weight") return rows_of(c.intermediate_size, s);
  if (rest == "mlp.down_proj.weight") return cols_of(c.intermediate_size, s);
  return {};  // norms and scalars: every rank holds them whole
}

HostTensor slice_host_tensor(const HostTensor& t, const TensorSlice& slice, bool describe_only) {
  if (slice.axis == TensorSlice::Axis::kWhole) return t;
  G4_CHECK(t.shape.size() == 2, "tensor '" + t.name + "': only matrices are split between ranks");
  const int64_t rows = t.shape[0], cols = t.shape[1];
  HostTensor out = t;
  if (slice.axis == TensorSlice::Axis::kRows) {
    G4_CHECK(slice.first >= 0 && slice.first + slice.count <= rows, "tensor '" + t.name + "': row slice out of range");
    const size_t row = row_bytes(t.dtype, cols);
    out.shape = {slice.count, cols};
    out.data = describe_only ? nullptr : static_cast<const uint8_t*>(t.data) + size_t(slice.first) * row;
    out.bytes = size_t(slice.count) * row;
    return out;
  }
  G4_CHECK(slice.first >= 0 && slice.first + slice.count <= cols, "tensor '" + t.name + "': column slice out of range");
  const int64_t block = is_block_quantized(t.dtype) ? block_size(t.dtype) : 1;
  G4_CHECK(slice.first % block == 0 && slice.count % block == 0,
           "tensor '" + t.name + "' (" + dtype_name(t.dtype) + ", blocks of " + std::to_string(block) +
               " columns) cannot be split by its " + std::to_string(cols) + " input columns into slices of " +
               std::to_string(slice.count) + " at column " + std::to_string(slice.first) +
               ": a slice must start and end on a block boundary (use fewer ranks or another weight type)");
  const size_t row = row_bytes(t.dtype, cols), part = row_bytes(t.dtype, slice.count);
  const size_t skip = row_bytes(t.dtype, slice.first);
  out.shape = {rows, slice.count};
  out.bytes = size_t(rows) * part;
  if (describe_only) {
    out.data = nullptr;
    return out;
  }
  auto copy = std::shared_ptr<uint8_t[]>(new uint8_t[out.bytes]);
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(copy.get() + size_t(r) * part, src + size_t(r) * row + skip, part);
  out.data = copy.get();
  out.owner = std::shared_ptr<void>(copy, copy.get());
  return out;
}

}  // namespace g4
