#include "backend/backend.h"

#include <cstddef>

#include "quant/tq4.h"

namespace g4 {

namespace {
constexpr int64_t kWordsPerRow = int64_t(sizeof(SamplingParams) / 4);
static_assert(sizeof(SamplingParams) % 4 == 0, "SamplingParams is stored as whole I32 words");
}  // namespace

SamplingRows SamplingRows::first(int64_t n) const { return slice(0, n); }

SamplingRows SamplingRows::slice(int64_t first_row, int64_t n) const {
  G4_ASSERT(first_row >= 0 && n >= 0 && first_row + n <= rows,
            "sampling rows: [" + std::to_string(first_row) + ", " + std::to_string(first_row + n) + ") of " +
                std::to_string(rows));
  return SamplingRows{storage.rows_view(first_row, n), n};
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

void Backend::set_bf16_weight_copies(bool on) {
  G4_REQUIRE(kUnsupported, !on,
             "the " + name() + " backend multiplies quantized weights without dequantizing them: bf16 weight copies "
             "(--bf16_weight_copies) are a CUDA backend option");
}

void Backend::check_tokens_to_ids(const Tensor& tokens, const Tensor& ids) {
  G4_CHECK(tokens.dtype == DType::I64 && ids.dtype == DType::I32 && tokens.cols == 1 && ids.cols == 1 &&
               tokens.rows == ids.rows,
           "tokens_to_ids: I64 tokens and I32 ids, one column of the same rows each");
}

void Backend::check_judge_drafts(const Tensor& target_logits, const DraftRows& drafts, const SamplingRows& params,
                                 const Tensor& verdict) {
  const int64_t k = drafts.count, last = drafts.first + (k - 1) * drafts.step;
  G4_CHECK(target_logits.dtype == DType::F32 && target_logits.rows == k + 1,
           "judge_drafts: F32 target logits of K + 1 rows for K drafts");
  G4_CHECK(k >= 1 && drafts.first >= 0 && drafts.step >= 1 && drafts.tokens.dtype == DType::I64 &&
               drafts.tokens.cols == 1 && last < drafts.tokens.rows,
           "judge_drafts: at least one draft, each a row of I64 tokens");
  G4_CHECK(drafts.logits.dtype == DType::F32 && drafts.logits.cols == target_logits.cols && last < drafts.logits.rows,
           "judge_drafts: each draft's F32 logits row, as wide as the target's");
  G4_CHECK(params.rows >= k + 1, "judge_drafts: one SamplingParams per verify row");
  G4_CHECK(verdict.dtype == DType::I64 && verdict.numel() == 2, "judge_drafts: an I64 verdict of two values");
}

void Backend::check_concat_cols(std::span<const Tensor> parts, const Tensor& out) {
  int64_t cols = 0;
  for (const Tensor& p : parts) {
    G4_CHECK(p.dtype == out.dtype && p.rows == out.rows, "concat_cols: every part needs the output's dtype and rows");
    cols += p.cols;
  }
  G4_CHECK(cols == out.cols, "concat_cols: the parts' columns must add up to the output's");
}

void Backend::check_rows(const Tensor& t, std::span<const int32_t> rows) {
  for (const int32_t r : rows)
    G4_CHECK(r >= 0 && r < t.rows, "row " + std::to_string(r) + " of a tensor of " + std::to_string(t.rows) + " rows");
}

void Backend::download_rows(const Tensor& src, std::span<const int32_t> rows, void* host) {
  check_rows(src, rows);
  auto* out = static_cast<std::byte*>(host);
  for (const int32_t r : rows) {
    download(src.rows_view(r, 1), out);
    out += src.row_size();
  }
}

void Backend::upload_rows(const void* host, std::span<const int32_t> rows, const Tensor& dst) {
  check_rows(dst, rows);
  const auto* in = static_cast<const std::byte*>(host);
  for (const int32_t r : rows) {
    upload(in, dst.rows_view(r, 1));
    in += dst.row_size();
  }
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
