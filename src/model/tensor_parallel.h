// Megatron-style tensor parallelism of Gemma 4 (docs/DESIGN.md, "Tensor parallel"): which part of
// the model each of N ranks holds, the checks that N splits the model, and the slices of the
// file's tensors a rank reads.
#pragma once
#include <string>

#include "format/tensor_source.h"
#include "model/config.h"

namespace g4 {

// Rank `rank` of a group of `size`; {0, 1} is the whole model on one device.
struct TpShard {
  int rank = 0, size = 1;
  bool split() const { return size > 1; }
};

// Throws "--tp N: …" naming the first size N does not divide: the query heads, each layer type's
// KV heads (N must divide them, or be a multiple of them: each KV head is then held by N / kv ranks),
// the MLP width and the vocabulary.
void check_tensor_parallel(const ModelConfig& c, int size);

// The KV heads rank s holds of a layer with `kv_heads`: kv_heads / size of them, or one (shared
// with the other size / kv_heads ranks whose query heads read it) when size > kv_heads.
struct HeadRange {
  int first = 0, count = 0;
};
HeadRange kv_heads_of_rank(int kv_heads, TpShard s);

// What one rank's forward sees: num_heads / N query heads, its KV heads per layer and an MLP of
// intermediate_size / N. The vocabulary stays whole (the LM head's shard is vocab_size / N rows,
// gathered back to whole rows; see Gemma4::logits).
ModelConfig rank_config(const ModelConfig& c, int size);

// A rank's part of a [out, in] tensor: all of it, rows [first, first + count) (an output split),
// or columns [first, first + count) (an input split).
struct TensorSlice {
  enum class Axis { kWhole, kRows, kCols } axis = Axis::kWhole;
  int64_t first = 0, count = 0;
};
// The slice of the tensor with canonical name `name` that shard `s` holds ("lm_head.weight" is the
// embedding's rows when the model ties them).
TensorSlice rank_slice(const ModelConfig& c, const std::string& name, TpShard s);
// `t` cut to `slice`: rows are a view of t's memory; columns are copied (each row's byte range),
// and for a block-quantized type must start and end on block boundaries (a clear error otherwise).
// With `describe_only` no bytes are copied (data stays null): the shape and size, to size the load.
HostTensor slice_host_tensor(const HostTensor& t, const TensorSlice& slice, bool describe_only = false);

}  // namespace g4
