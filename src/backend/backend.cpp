#include "backend/backend.h"

#include "quant/tq4.h"

namespace g4 {

namespace {
constexpr int64_t kWordsPerRow = int64_t(sizeof(SamplingParams) / 4);
static_assert(sizeof(SamplingParams) % 4 == 0, "SamplingParams is stored as whole I32 words");
}  // namespace

SamplingRows SamplingRows::first(int64_t n) const {
  G4_ASSERT(n >= 0 && n <= rows, "sampling rows: " + std::to_string(n) + " of " + std::to_string(rows));
  return SamplingRows{storage.rows_view(0, n), n};
}

int64_t kv_cache_cols(DType dtype, int kv_heads, int head_dim) {
  const int64_t values = int64_t(kv_heads) * head_dim;
  if (dtype == DType::TQ4) {
    tq4::check_dim(head_dim);
    const int64_t bytes = int64_t(kv_heads) * tq4::vector_bytes(head_dim);
    return (bytes + 15) / 16 * 16;
  }
  if (dtype == DType::Q8_0)
    G4_CHECK(head_dim % kQ8BlockSize == 0, "Q8_0 KV caches need a head dim that is a multiple of 32, not " +
                                               std::to_string(head_dim));
  return values;
}

KvCache one_page_kv_cache(Backend& backend, Tensor k, Tensor v) {
  G4_CHECK(k.rows == v.rows && k.cols == v.cols, "a one-page KV cache: K and V of one shape");
  const int64_t capacity = k.rows;
  KvCache cache{std::move(k), std::move(v), backend.alloc(DType::I32, 1, 1), capacity, capacity};
  const int32_t page = 0;
  backend.upload(&page, cache.table);
  return cache;
}

KvCache one_page_kv_cache(Backend& backend, DType dtype, int64_t capacity, int64_t kv_cols) {
  return one_page_kv_cache(backend, backend.alloc(dtype, capacity, kv_cols), backend.alloc(dtype, capacity, kv_cols));
}

void Backend::check_tokens_to_ids(const Tensor& tokens, const Tensor& ids) {
  G4_CHECK(tokens.dtype == DType::I64 && ids.dtype == DType::I32 && tokens.cols == 1 && ids.cols == 1 &&
               tokens.rows == ids.rows,
           "tokens_to_ids: I64 tokens and I32 ids, one column of the same rows each");
}

void Backend::check_concat_cols(std::span<const Tensor> parts, const Tensor& out) {
  int64_t cols = 0;
  for (const Tensor& p : parts) {
    G4_CHECK(p.dtype == out.dtype && p.rows == out.rows, "concat_cols: every part needs the output's dtype and rows");
    cols += p.cols;
  }
  G4_CHECK(cols == out.cols, "concat_cols: the parts' columns must add up to the output's");
}

SamplingRows Backend::alloc_sampling_rows(int64_t rows) {
  return SamplingRows{alloc(DType::I32, rows, kWordsPerRow), rows};
}

void Backend::upload_sampling_rows(std::span<const SamplingParams> rows, const SamplingRows& dst) {
  G4_CHECK(int64_t(rows.size()) <= dst.rows, "sampling rows: " + std::to_string(rows.size()) +
                                                 " rows do not fit a buffer of " + std::to_string(dst.rows));
  if (!rows.empty()) upload(rows.data(), dst.storage.rows_view(0, int64_t(rows.size())));
}

}  // namespace g4
