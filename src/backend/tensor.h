// A 2-D row-major tensor in some backend's memory (host memory for the CPU backend, device memory
// for CUDA). Higher-rank data is viewed as 2-D: [tokens, heads*head_dim] or [tokens*heads, head_dim].
#pragma once
#include <cstdint>
#include <memory>

#include "util/dtype.h"

namespace g4 {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  std::shared_ptr<void> owner;  // keeps the memory alive; views share it

  bool empty() const { return data == nullptr; }
  size_t row_size() const { return row_bytes(dtype, cols); }
  size_t bytes() const { return size_t(rows) * row_size(); }
  int64_t numel() const { return rows * cols; }

  // Rows [first, first + n) as a view.
  Tensor rows_view(int64_t first, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<uint8_t*>(data) + size_t(first) * row_size();
    t.rows = n;
    return t;
  }
  // The same contiguous memory seen with another row length (rows*cols must not change).
  Tensor reshaped(int64_t new_rows, int64_t new_cols) const {
    Tensor t = *this;
    t.rows = new_rows;
    t.cols = new_cols;
    return t;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

}  // namespace g4
