#include "support/row_copies.h"

#include <algorithm>

#include "util/error.h"

namespace g4::test {
namespace {

int32_t word(int64_t row, int64_t col) { return int32_t(row * 1000003 + col + 1); }

}  // namespace

int64_t row_copy_mismatches(Backend& be, int64_t rows, int64_t cols, const std::vector<int32_t>& order) {
  Tensor t = be.alloc(DType::I32, rows, cols);
  std::vector<int32_t> host(order.size() * size_t(cols));
  for (size_t k = 0; k < order.size(); ++k)
    for (int64_t c = 0; c < cols; ++c) host[k * size_t(cols) + size_t(c)] = word(order[k], c);
  be.upload_rows(host.data(), order, t);

  int64_t mismatches = 0;
  std::vector<int32_t> whole(size_t(rows * cols));
  be.download(t, whole.data());
  for (int64_t r = 0; r < rows; ++r) {
    const bool written = std::find(order.begin(), order.end(), int32_t(r)) != order.end();
    for (int64_t c = 0; c < cols; ++c) mismatches += whole[size_t(r * cols + c)] != (written ? word(r, c) : 0);
  }
  const std::vector<int32_t> reversed(order.rbegin(), order.rend());
  std::vector<int32_t> back(host.size(), -1);
  be.download_rows(t, reversed, back.data());
  for (size_t k = 0; k < reversed.size(); ++k)
    for (int64_t c = 0; c < cols; ++c) mismatches += back[k * size_t(cols) + size_t(c)] != word(reversed[k], c);

  const std::vector<int32_t> past_the_end = {int32_t(rows)};
  try {
    be.download_rows(t, past_the_end, back.data());
    ++mismatches;  // no error: count it
  } catch (const Error&) {
  }
  return mismatches;
}

}  // namespace g4::test
