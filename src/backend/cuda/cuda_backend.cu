// The CUDA backend: bf16 activations, bf16 or packed block-quantized weights (packed_blocks.h),
// float32 accumulation, every op enqueued on one stream (download is the only synchronisation),
// on-device sampling, and steps recorded as CUDA graphs.
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_profiler_api.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_workspace.h"
#include "backend/cuda/draft_verdict.h"
#include "backend/cuda/host_staging.h"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/q4_0_records.h"
#include "backend/cuda/quantized_kv_kernels.h"
#include "backend/memory_meter.h"
#include "format/tensor_source.h"
#include "backend/cuda/cuda_sampler.h"
#include "sampling/sampling_params.h"

namespace g4 {

namespace {

void cublas_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorKind::kInternal, std::string("cuBLAS error in ") + call + ": " + cublasGetStatusString(status));
}
#define G4_CUBLAS(call) cublas_check((call), #call)

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
constexpr size_t kStagingBytes = size_t(64) << 20;  // host weights pass through here to be widened or packed
// Prefill over packed weights dequantizes chunks of rows into two bf16 scratches, each at most this
// size (and no larger than the largest packed matrix needs): a chunk's GEMM then has rows enough to
// fill the GPU at a few hundred tokens, and the next chunk is dequantized on a second stream while
// it runs (docs/DESIGN.md §3, "Prefill").
constexpr size_t kDequantizedBytes = size_t(128) << 20;
// Most split-K partitions of decode attention: past 128 x 32 keys a split holds several tiles. At
// long contexts 128 splits of 8 tiles decode faster than 256 of 4 (docs/PERF.md), and the partials
// take half the memory.
constexpr int kDecodeSplits = 128;

template <typename T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.data); }

void expect_dtype(const Tensor& t, DType want, const char* what) {
  G4_CHECK(t.dtype == want, std::string("cuda backend: ") + what + " must be " + dtype_name(want) + ", got " +
                                dtype_name(t.dtype));
}

// A weight matrix: bf16, or packed in a block type.
void expect_weight(const Tensor& t, const char* what) {
  if (!is_block_quantized(t.dtype)) expect_dtype(t, DType::BF16, what);
}

// How upload_weight stores a weight: matrices in a block type stay packed, other matrices become
// bf16, 1-D tensors (norm weights, layer scalars) float32.
DType storage_dtype(const HostTensor& w) {
  if (w.shape.size() < 2) return DType::F32;
  return is_block_quantized(w.dtype) ? w.dtype : DType::BF16;
}

int64_t weight_rows(const HostTensor& w) { return w.shape.size() >= 2 ? w.shape[0] : 1; }
int64_t weight_cols(const HostTensor& w) { return w.shape.empty() ? 1 : w.numel() / weight_rows(w); }

// A norm weight or scalar (F32 on this backend), or nullptr when `t` is empty.
const float* optional_f32(const Tensor& t, const char* what) {
  if (t.empty()) return nullptr;
  expect_dtype(t, DType::F32, what);
  return static_cast<const float*>(t.data);
}

// How a weight matrix is stored: bf16, packed in its block type (packed_blocks.h), or a Q4_0
// matrix rearranged into records (q4_0_records.h).
enum class WeightLayout { kBf16, kPacked, kQ4_0Records };

// The kernels of y[T, N] = x[T, K] · w^T.
enum class MatmulPath {
  kRecords,          // launch_q4_0_records_matmuls
  kPackedGemv,       // launch_quantize_activations, then launch_packed_gemv
  kPackedBatchGemv,  // launch_quantize_batch_activations, then launch_packed_batch_gemv
  kGemvRowGroups,    // the GEMV (bf16 or packed) on kMaxGemvTokens rows at a time
  kBatchRowGroups,   // kMaxPackedMatmulTokens rows at a time, each group on its own path
  kPackedMatmul,     // launch_packed_matmul (tensor cores)
  kDequantizedGemm,  // chunks of rows dequantized to bf16, then cuBLAS (multiply_dequantized_chunk)
  kGemv,             // launch_gemv over bf16
  kCublas,           // cuBLAS over bf16
  kBf16Copy,         // cuBLAS over the weight's bf16 copy (set_bf16_weight_copies)
};

// The kernel for a weight stored as `layout` (with a bf16 copy beside it, or not) and T rows of K
// values; the first row that matches:
//
//   layout        rows T                               batch invariant  path
//   with a copy   kBf16CopyFromRows..                  no               kBf16Copy
//   with a copy   257..                                yes              kBf16Copy
//   Q4_0 records  1..256                               -                kRecords
//   Q4_0 records  257..                                -                kDequantizedGemm
//   packed        packed_gemv_takes(T, K): 1..8 rows,  -                kPackedGemv
//                 without invariance 1..4 when the
//                 packed matmul fits
//   packed        9..64, packed_batch_gemv_fits        yes              kPackedBatchGemv (no Q6_K)
//   packed        9..64                                yes              kGemvRowGroups (Q6_K)
//   packed        65..256                              yes              kBatchRowGroups
//   packed        5..64, K % 128 == 0                  no               kPackedMatmul
//   packed        any other                            -                kDequantizedGemm
//   bf16          1..8, K % 8 == 0                     -                kGemv
//   bf16          9..256, K % 8 == 0                   yes              kGemvRowGroups
//   bf16          any other                            -                kCublas
//
// Where Q4_0 records come from: a Q4_0 matrix of whole records (records::fits_records) is
// rearranged into records while batch invariance is asked for (set_batch_invariant), before any
// forward that asks for it: when invariance is turned on (every Q4_0 matrix allocated so far) and
// whenever such a matrix is written while it is on (upload_weight, upload, fill_uniform). No op
// changes a weight's layout, so a graph capture may hold any op. Records are not made for every
// eligible matrix regardless of invariance: without it the packed GEMV (1..4 rows) and the packed
// matmul run faster over the packed layout than the records kernels, and the records kernels give
// other bits than those.
//
// A bf16 copy replaces the per-call dequantization wherever that ran, and, without invariance, the
// packed matmul from kBf16CopyFromRows rows on, where reading the copy (2 bytes a weight) at the
// memory's rate takes less time than the packed matmul takes over the packed weight.
MatmulPath choose_matmul_path(DType weight, WeightLayout layout, bool bf16_copy, int64_t T, int64_t K,
                              bool batch_invariant) {
  if (bf16_copy && T >= (batch_invariant ? kMaxBatchInvariantRows + 1 : kBf16CopyFromRows)) return MatmulPath::kBf16Copy;
  if (layout == WeightLayout::kQ4_0Records)
    return T <= kMaxRecordsTokens ? MatmulPath::kRecords : MatmulPath::kDequantizedGemm;
  if (layout == WeightLayout::kPacked) {
    if (packed_gemv_takes(T, K, batch_invariant)) return MatmulPath::kPackedGemv;
    if (batch_invariant && packed_batch_gemv_fits(weight, T, K)) return MatmulPath::kPackedBatchGemv;
    if (batch_invariant && T <= kMaxPackedMatmulTokens) return MatmulPath::kGemvRowGroups;
    if (batch_invariant && T <= kMaxBatchInvariantRows) return MatmulPath::kBatchRowGroups;
    if (packed_matmul_fits(T, K)) return MatmulPath::kPackedMatmul;
    return MatmulPath::kDequantizedGemm;
  }
  if (T <= kMaxGemvTokens && K % 8 == 0) return MatmulPath::kGemv;
  if (batch_invariant && T <= kMaxBatchInvariantRows && K % 8 == 0) return MatmulPath::kGemvRowGroups;
  return MatmulPath::kCublas;
}

// A recorded step: an executable CUDA graph (destroyed unchecked: a destructor must not throw).
struct CudaGraph final : Backend::RecordedStep {
  cudaGraphExec_t exec = nullptr;
  uint64_t allocations = 0;  // the backend's allocation count when it was recorded
  ~CudaGraph() override {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() : workspace_([this](DType dtype, int64_t rows, int64_t cols) { return alloc(dtype, rows, cols); }) {
    G4_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    G4_CUDA(cudaStreamCreateWithFlags(&dequantize_stream_, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&stream_point_, &chunk_ready_[0], &chunk_ready_[1], &chunk_read_[0], &chunk_read_[1]})
      G4_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    G4_CUBLAS(cublasCreate(&cublas_));
    G4_CUBLAS(cublasSetStream(cublas_, stream_));
    workspace_.reserve_cublas(kCublasWorkspaceBytes);
    G4_CUBLAS(cublasSetWorkspace(cublas_, workspace_.cublas.data, kCublasWorkspaceBytes));
    upload_tq4_tables();
  }
  // Unchecked: a destructor must not throw, and teardown has nothing to recover.
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(dequantize_stream_);
    sampler_.reset();
    cublasDestroy(cublas_);
    for (cudaEvent_t e : {stream_point_, chunk_ready_[0], chunk_ready_[1], chunk_read_[0], chunk_read_[1]})
      cudaEventDestroy(e);
    cudaStreamDestroy(dequantize_stream_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::BF16; }
  // The GEMV's per-row sums do not depend on the row count; it takes up to kMaxGemvTokens rows (packed
  // weights: fewer than kPackedMatmulFromRows, packed_gemv_takes), and beyond that the packed
  // tensor-core matmul and cuBLAS pick their reductions by shape. With batch invariance asked for,
  // up to kMaxBatchInvariantRows rows run the records matmul over Q4_0, the batch GEMV over other
  // packed weights (the GEMV's bits for each row, docs/DESIGN.md §7; kMaxPackedMatmulTokens rows at a
  // time) or, for bf16 and Q6_K weights, the GEMV 8 rows at a time.
  int64_t batch_invariant_rows() const override {
    return batch_invariant_ ? kMaxBatchInvariantRows : kPackedMatmulFromRows - 1;
  }
  // Turned on, every Q4_0 matrix allocated so far is rearranged into records (see
  // choose_matmul_path); turned off, matrices already in records stay so.
  void set_batch_invariant(bool on) override {
    G4_CHECK(!capturing_, "cuda backend: batch invariance changed while capturing a graph");
    batch_invariant_ = on;
    if (!on) return;
    for (const Tensor& w : live_quantized_matrices())
      if (w.dtype == DType::Q4_0 && records::fits_records(w.rows, w.cols)) to_records(w);
  }
  // Turned on, every block-quantized matrix allocated so far gets its copy now, and every one
  // written later when it is written; turned off, the copies are freed.
  void set_bf16_weight_copies(bool on) override {
    G4_CHECK(!capturing_, "cuda backend: bf16 weight copies changed while capturing a graph");
    bf16_copies_on_ = on;
    if (!on) {
      bf16_copies_.clear();
      return;
    }
    for (const Tensor& w : live_quantized_matrices()) keep_bf16_copy(w);
  }

  Tensor alloc(DType dtype, int64_t rows, int64_t cols) override {
    G4_CHECK(!capturing_, "cuda backend: an allocation while capturing a graph (run one forward before capturing)");
    ++allocations_;
    // The copies of weights freed since go first, before their memory is asked for again.
    std::erase_if(bf16_copies_, [](const auto& entry) { return entry.second.of.expired(); });
    Tensor t;
    t.dtype = dtype;
    t.rows = rows;
    t.cols = cols;
    const size_t bytes = std::max<size_t>(t.bytes(), 1);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {  // a clearer message than G4_CUDA's, then the same error
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);  // best effort: only for the message
      throw Error(ErrorKind::kResourceExhausted, "CUDA out of memory: cannot allocate " + std::to_string(bytes >> 20) + " MiB for a [" +
                  std::to_string(rows) + ", " + std::to_string(cols) + "] " + dtype_name(dtype) + " tensor (" +
                  std::to_string(free_bytes >> 20) + " MiB free of " + std::to_string(total >> 20) +
                  " MiB); use a smaller max_seq_len or prefill chunk");
    }
    G4_CUDA(status);
    t.owner = memory_.track(p, bytes, [](void* q) { cudaFree(q); });
    t.data = p;
    G4_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
    if (is_block_quantized(dtype)) workspace_.reserve_packed(rows, cols, kDequantizedBytes);
    if (is_block_quantized(dtype)) quantized_matrices_.push_back({t.data, dtype, rows, cols, t.owner});
    return t;
  }

  void upload(const void* host, const Tensor& dst) override {
    G4_CUDA(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
    rewritten(dst);
  }

  void download(const Tensor& src, void* host) override {
    G4_CUDA(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
    G4_CUDA(cudaStreamSynchronize(stream_));
  }

  void download_rows(const Tensor& src, std::span<const int32_t> rows, void* host) override {
    check_rows(src, rows);
    host_staging_.download_rows(static_cast<const std::byte*>(src.data), src.row_size(), rows,
                                static_cast<std::byte*>(host), stream_);
  }

  void upload_rows(const void* host, std::span<const int32_t> rows, const Tensor& dst) override {
    check_rows(dst, rows);
    host_staging_.upload_rows(static_cast<const std::byte*>(host), dst.row_size(), rows,
                              static_cast<std::byte*>(dst.data), stream_);
    rewritten(dst);
  }

  // Streamed through a device staging buffer in chunks of rows, widened (launch_convert_weight) or
  // packed (launch_pack_rows) into place.
  Tensor upload_weight(const HostTensor& w) override {
    const int64_t rows = weight_rows(w), cols = weight_cols(w);
    G4_CHECK(row_bytes(w.dtype, cols) * size_t(rows) == w.bytes,
             "tensor '" + w.name + "': byte size does not match its shape and dtype");
    const DType storage = storage_dtype(w);
    Tensor t = alloc(storage, rows, cols);
    dequantize_must_wait_ = true;
    if (w.dtype == storage && !is_block_quantized(storage)) {
      upload(w.data, t);
      return t;
    }
    const size_t src_row = row_bytes(w.dtype, cols);
    workspace_.reserve_staging(std::max(kStagingBytes, src_row), true);
    const Tensor& staging = workspace_.staging;
    const int64_t chunk = int64_t(staging.bytes() / src_row);
    for (int64_t r = 0; r < rows; r += chunk) {
      const int64_t n = std::min(chunk, rows - r);
      G4_CUDA(cudaMemcpyAsync(staging.data, static_cast<const uint8_t*>(w.data) + size_t(r) * src_row,
                              size_t(n) * src_row, cudaMemcpyHostToDevice, stream_));
      if (is_block_quantized(storage))
        launch_pack_rows(storage, ptr<uint8_t>(staging), r, n, ptr<uint8_t>(t), rows, cols, stream_);
      else
        launch_convert_weight(staging.data, w.dtype, n, cols, static_cast<uint8_t*>(t.data) + size_t(r) * t.row_size(),
                              storage == DType::F32, stream_);
    }
    keep_in_records(t);
    keep_bf16_copy(t);
    return t;
  }

  bool runs_weight_dtype(DType t) const override {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16 || is_block_quantized(t);
  }
  bool runs_kv_dtype(DType t) const override { return t == activation_dtype() || is_quantized_kv(t); }

  size_t weight_bytes_on_backend(const HostTensor& w) const override {
    const DType storage = storage_dtype(w);
    const size_t rows = size_t(weight_rows(w)), cols = size_t(weight_cols(w));
    const size_t copy = bf16_copies_on_ && is_block_quantized(storage) ? rows * cols * sizeof(bf16) : 0;
    return row_bytes(storage, int64_t(cols)) * rows + copy;
  }

  size_t free_memory_bytes() const override {
    size_t free_bytes = 0, total = 0;
    G4_CUDA(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
  }

  void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) override {
    expect_weight(table, "embedding table");
    G4_CHECK(out.cols == table.cols && out.rows == ids.rows, "embed: the output must be [tokens, table columns]");
    // docs/DESIGN.md §2: the scale is a bf16 number when the activations are bf16 (as in transformers).
    const float scale_bf16 = __bfloat162float(__float2bfloat16(scale));
    if (in_records(table))
      return launch_embed_q4_0_records(ptr<uint8_t>(table), table.rows, table.cols, ptr<int32_t>(ids), ids.rows,
                                       scale_bf16, ptr<bf16>(out), stream_);
    if (is_block_quantized(table.dtype))
      return launch_embed_packed(table.dtype, ptr<uint8_t>(table), table.rows, table.cols, ptr<int32_t>(ids), ids.rows,
                                 scale_bf16, ptr<bf16>(out), stream_);
    launch_embed(ptr<bf16>(table), ptr<int32_t>(ids), ids.rows, out.cols, scale_bf16, ptr<bf16>(out), stream_);
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
    expect_dtype(x, DType::BF16, "rms_norm input");
    launch_rms_norm(ptr<bf16>(x), x.rows, x.cols, optional_f32(weight, "rms_norm weight"), eps, ptr<bf16>(out),
                    stream_);
  }

  void matmul(const Tensor& x, const Tensor& w, const Tensor& y) override { matmul_with(x, nullptr, w, y); }
  void matmuls(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> ys) override {
    matmuls_with(x, nullptr, ws, ys);
  }
  void gated_gelu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& out) override {
    gated_gelu_with(x, nullptr, w_gate, w_up, out);
  }
  void residual_norm(const Tensor& x, const Tensor& o, const Tensor& post_weight, const Tensor& scalar, float eps,
                     const Tensor& next_weight, const Tensor& next_out) override {
    residual_norm_with(x, o, post_weight, scalar, eps, next_weight, next_out, nullptr);
  }
  void projected_residual_norm(const Tensor& a, const Tensor& w, const Tensor& o, const Tensor& x,
                               const Tensor& post_weight, const Tensor& scalar, float eps, const Tensor& next_weight,
                               const Tensor& next_out) override {
    projected_residual_norm_with(a, nullptr, w, o, x, post_weight, scalar, eps, next_weight, next_out, nullptr);
  }
  void normed_attention(const HeadNorms& norms, const AttentionArgs& args) override {
    normed_attention_with(norms, args, false);
  }

  // The fused ops: a one-row output is quantized for the packed GEMV by the kernel that writes it
  // (residual_norm's next_out, the decode attention's output), and its readers in the same call
  // take those planes instead of quantizing it again (quantized_input): the same planes, one launch
  // fewer (quantized_planes.cuh).
  void end_block(const BlockEnd& e) override { end_block_with(e, nullptr); }
  void normed_attention_then(std::span<const HeadNorms> norms, std::span<const AttentionArgs> args,
                             const BlockEnd& end) override {
    const Tensor& out = args.size() == 1 ? args[0].out : Tensor{};
    // The planes of the one sequence's output, which the block end reads as its `a`.
    const bool one_row = args.size() == 1 && end.a.data == out.data && end.a.rows == 1 && end.a.cols == out.cols;
    const uint4* planes = one_row ? normed_attention_with(norms[0], args[0], true) : nullptr;
    if (!one_row) normed_attention_batch(norms, args);
    end_block_with(end, planes);
  }
  void set_fusion(bool on) override { fusion_ = on; }

  // matmul of x, whose quantized planes are `planes` when not null (else quantized when a kernel
  // needs them).
  void matmul_with(const Tensor& x, const uint4* planes, const Tensor& w, const Tensor& y) {
    expect_dtype(x, DType::BF16, "matmul input");
    expect_weight(w, "matmul weight");
    G4_CHECK(x.cols == w.cols && y.cols == w.rows && y.rows == x.rows,
             "matmul shape mismatch: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "], w [" +
                 std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]");
    const int64_t T = x.rows, K = x.cols, N = w.rows;
    const MatmulPath path = matmul_path(w, T, K);
    switch (path) {
      case MatmulPath::kRecords: {
        const Tensor ws[] = {w}, ys[] = {y};
        return records_matmuls(x, ws, ys);
      }
      case MatmulPath::kPackedGemv: {
        const PackedGemvTarget target{ptr<uint8_t>(w), ptr<bf16>(y), N};
        return launch_packed_gemv(w.dtype, quantized_input(x, planes), &target, 1, T, K, sum_order(), stream_);
      }
      case MatmulPath::kPackedBatchGemv:
        launch_quantize_batch_activations(ptr<bf16>(x), T, K, ptr<uint8_t>(workspace_.batch_quantized), stream_);
        return launch_packed_batch_gemv(w.dtype, ptr<uint8_t>(workspace_.batch_quantized), ptr<uint8_t>(w),
                                        ptr<bf16>(y), T, N, K, ptr<float>(workspace_.packed_partials),
                                        workspace_.packed_partials.bytes(), stream_);
      case MatmulPath::kGemvRowGroups:
      case MatmulPath::kBatchRowGroups:
        return for_row_groups(T, rows_per_group(path), [&](int64_t first, int64_t n) {
          matmul(x.rows_view(first, n), w, y.rows_view(first, n));
        });
      case MatmulPath::kPackedMatmul:
        return launch_packed_matmul(w.dtype, ptr<bf16>(x), ptr<uint8_t>(w), ptr<bf16>(y), T, N, K,
                                    ptr<float>(workspace_.packed_partials), workspace_.packed_partials.bytes(), stream_);
      case MatmulPath::kDequantizedGemm: {
        // Chunks of rows dequantized into the two scratches in turn, each chunk's GEMM writing its
        // columns of y.
        const int64_t chunk = dequantized_rows_per_chunk(K);
        for (int64_t r = 0; r < N; r += chunk) multiply_dequantized_chunk(x, w, y, r, std::min(chunk, N - r));
        return;
      }
      case MatmulPath::kGemv: {
        const GemvTarget target{ptr<bf16>(w), ptr<bf16>(y), N};
        return launch_gemv(ptr<bf16>(x), &target, 1, T, K, stream_);
      }
      case MatmulPath::kCublas:
        return gemm(w.data, x.data, ptr<bf16>(y), N, T, K, N);
      case MatmulPath::kBf16Copy:
        return gemm(bf16_copy_of(w)->data, x.data, ptr<bf16>(y), N, T, K, N);
    }
  }

  // A few tokens: the matrices of each weight type in one GEMV launch (a Q4_K_M file's v_proj may
  // be Q6_K beside Q4_K q and k), the input quantized once for all packed ones; otherwise one
  // matmul each.
  void matmuls_with(const Tensor& x, const uint4* planes, std::span<const Tensor> ws, std::span<const Tensor> ys) {
    if (all_take(x, ws, ys, kMaxSliceSums, {MatmulPath::kRecords})) return records_matmuls(x, ws, ys);
    // A weight without its output goes to Backend::matmuls, whose check names it.
    if (!all_take(x, ws, ys, kMaxGemvTargets, {MatmulPath::kGemv, MatmulPath::kPackedGemv}))
      return Backend::matmuls(x, ws, ys);
    expect_dtype(x, DType::BF16, "matmul input");
    const uint4* quantized = nullptr;
    bool launched[kMaxGemvTargets] = {};
    for (size_t i = 0; i < ws.size(); ++i) {
      if (launched[i]) continue;
      const DType type = ws[i].dtype;
      GemvTarget bf16_targets[kMaxGemvTargets];
      PackedGemvTarget packed_targets[kMaxGemvTargets];
      int count = 0;
      for (size_t j = i; j < ws.size(); ++j) {
        if (ws[j].dtype != type) continue;
        launched[j] = true;
        expect_weight(ws[j], "matmul weight");
        G4_CHECK(ys[j].rows == x.rows && ys[j].cols == ws[j].rows, "matmuls: output shape does not match its weight");
        bf16_targets[count] = GemvTarget{ptr<bf16>(ws[j]), ptr<bf16>(ys[j]), ws[j].rows};
        packed_targets[count++] = PackedGemvTarget{ptr<uint8_t>(ws[j]), ptr<bf16>(ys[j]), ws[j].rows};
      }
      if (!is_block_quantized(type)) {
        launch_gemv(ptr<bf16>(x), bf16_targets, count, x.rows, x.cols, stream_);
        continue;
      }
      if (!quantized) quantized = quantized_input(x, planes);
      launch_packed_gemv(type, quantized, packed_targets, count, x.rows, x.cols, sum_order(), stream_);
    }
  }

  void head_norms(const HeadNorms& n) override {
    check_head_norms(n);
    HeadNormLaunch a;
    a.q = ptr<bf16>(n.q);
    a.k = ptr<bf16>(n.k);
    a.v = ptr<bf16>(n.v);
    a.v_in = ptr<bf16>(n.v_in);
    a.q_weight = optional_f32(n.q_weight, "q_norm weight");
    a.k_weight = optional_f32(n.k_weight, "k_norm weight");
    a.q_rows = n.q.rows;
    a.k_rows = n.k.rows;
    a.v_rows = n.v.rows;
    a.T = n.positions.rows;
    a.q_first = n.q_first;
    a.head_dim = n.q.cols;
    a.eps = n.eps;
    a.positions = ptr<int32_t>(n.positions);
    a.inv_freq = ptr<float>(n.inv_freq);
    workspace_.reserve_rope_table(rope_table_floats(a.T, a.head_dim));
    a.rope_table = ptr<float2>(workspace_.rope_table);
    launch_head_norms(a, stream_);
  }

  void attention(const AttentionArgs& args) override {
    if (is_quantized_kv(args.cache->k.dtype)) return quantized_attention(args);
    const AttentionLaunch a = attention_launch(args);
    if (args.rows_as_decode_steps && !a.cache_only && chunk_on_decode_kernels(a.T, a.q_first, a.window, a.capacity())) {
      reserve_decode_attention(a.heads, a.head_dim, a.T);
      return launch_chunk_on_decode_kernels(a, ptr<float>(workspace_.attention_partials), kDecodeSplits, stream_,
                                            splits_bound(std::span(&args, 1)));
    }
    if (a.T > 1) return launch_prefill_attention(a, stream_);
    launch_decode_attention(a, own_caches(a), ptr<float>(workspace_.attention_partials), kDecodeSplits, nullptr, stream_,
                            splits_bound(std::span(&args, 1)));
  }

  // One decode token (with fusion on): the head norms are folded into the attention launch, which
  // reads the raw projections (V from v_in: K itself on K=V layers) and, with `quantize_out`,
  // quantizes its output row alongside; returns those planes (null: none written). Over a
  // quantized cache the head norms run first: the store encodes the normed rows.
  const uint4* normed_attention_with(const HeadNorms& norms, const AttentionArgs& args, bool quantize_out) {
    if (!fusion_ || !folds_norms(norms, args) || is_quantized_kv(args.cache->k.dtype)) {
      Backend::normed_attention(norms, args);
      return nullptr;
    }
    const AttentionLaunch a = folded_launch(norms, args);
    uint4* planes = quantize_out && quantizable_attention(a, args.out) ? planes_for(args.out, true) : nullptr;
    launch_decode_attention(a, own_caches(a), ptr<float>(workspace_.attention_partials), kDecodeSplits, planes, stream_,
                            splits_bound(std::span(&args, 1)));
    return planes;
  }


  // A decode batch (one token per sequence, sequence i in row i of every tensor): one launch pair
  // per kMaxDecodeSequences sequences instead of one per sequence; each sequence's arithmetic is
  // that of normed_attention alone.
  void normed_attention_batch(std::span<const HeadNorms> norms, std::span<const AttentionArgs> args) override {
    if (!fusion_ || !decode_rows_in_order(norms, args)) return Backend::normed_attention_batch(norms, args);
    if (is_quantized_kv(args[0].cache->k.dtype)) return quantized_decode_batch(norms, args);
    for (size_t at = 0; at < args.size(); at += kMaxDecodeSequences) {
      const AttentionLaunch a = folded_launch(norms[at], args[at]);
      DecodeCaches caches;
      caches.sequences = int(std::min(args.size() - at, size_t(kMaxDecodeSequences)));
      for (int z = 0; z < caches.sequences; ++z) {
        caches.k[z] = ptr<bf16>(args[at + size_t(z)].cache->k);
        caches.v[z] = ptr<bf16>(args[at + size_t(z)].cache->v);
        caches.table[z] = ptr<int32_t>(args[at + size_t(z)].cache->table);
      }
      reserve_decode_attention(a.heads, a.head_dim, caches.sequences);
      launch_decode_attention(a, caches, ptr<float>(workspace_.attention_partials), kDecodeSplits, nullptr, stream_,
                              splits_bound(args.subspan(at, size_t(caches.sequences))));
    }
  }

  // Attention over a quantized cache (one sequence): the chunk's K/V rows stored, then read back
  // with every other key and value.
  void quantized_attention(const AttentionArgs& args) {
    const QuantizedKvLaunch q = quantized_launch(args);
    if (!args.reads_cache_only) launch_store_quantized_kv(q, stream_);
    if (q.a.T > 1) return launch_quantized_prefill_attention(q, stream_);
    launch_quantized_decode_attention(q, ptr<float>(workspace_.attention_partials), kDecodeSplits, stream_,
                                      splits_bound(std::span(&args, 1)));
  }

  // A decode batch over quantized caches (decode_rows_in_order): every sequence's head norms in one
  // launch (their rows are one tensor's), then one store and one attention launch pair per
  // kMaxDecodeSequences sequences; each sequence's arithmetic is that of attention alone.
  void quantized_decode_batch(std::span<const HeadNorms> norms, std::span<const AttentionArgs> args) {
    HeadNorms all = norms[0];
    for (Tensor* t : {&all.q, &all.k, &all.v_in, &all.v, &all.positions}) t->rows *= int64_t(args.size());
    head_norms(all);
    for (size_t at = 0; at < args.size(); at += kMaxDecodeSequences) {
      QuantizedKvLaunch q = quantized_launch(args[at]);
      q.caches.sequences = int(std::min(args.size() - at, size_t(kMaxDecodeSequences)));
      for (int z = 1; z < q.caches.sequences; ++z) {
        const KvCache& cache = *args[at + size_t(z)].cache;
        q.caches.k[z] = ptr<uint8_t>(cache.k);
        q.caches.v[z] = ptr<uint8_t>(cache.v);
        q.caches.table[z] = ptr<int32_t>(cache.table);
      }
      reserve_decode_attention(q.a.heads, q.a.head_dim, q.caches.sequences);
      launch_store_quantized_kv(q, stream_);
      launch_quantized_decode_attention(q, ptr<float>(workspace_.attention_partials), kDecodeSplits, stream_,
                                        splits_bound(args.subspan(at, size_t(q.caches.sequences))));
    }
  }

  void gated_gelu_with(const Tensor& x, const uint4* planes, const Tensor& w_gate, const Tensor& w_up,
                       const Tensor& out) {
    expect_dtype(x, DType::BF16, "gated_gelu input");
    expect_weight(w_gate, "gated_gelu gate weight");
    expect_weight(w_up, "gated_gelu up weight");
    G4_CHECK(x.cols == w_gate.cols && x.cols == w_up.cols && w_gate.rows == w_up.rows && out.cols == w_gate.rows &&
                 out.rows == x.rows,
             "gated_gelu shape mismatch: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                 "], w_gate [" + std::to_string(w_gate.rows) + ", " + std::to_string(w_gate.cols) + "]");
    const int64_t T = x.rows, K = x.cols, N = w_gate.rows;
    // Gate and up of one type and layout take the same path (their shapes are the same).
    const MatmulPath path = matmul_path(w_gate, T, K);
    if (w_gate.dtype == w_up.dtype && layout_of(w_gate) == layout_of(w_up)) {
      if (path == MatmulPath::kPackedGemv) {
        launch_packed_gated_gelu(w_gate.dtype, quantized_input(x, planes), ptr<uint8_t>(w_gate), ptr<uint8_t>(w_up),
                                 ptr<bf16>(out), T, N, K, sum_order(), stream_);
        return;
      }
      if (path == MatmulPath::kGemv) {
        launch_gated_gelu(ptr<bf16>(x), ptr<bf16>(w_gate), ptr<bf16>(w_up), ptr<bf16>(out), T, N, K, stream_);
        return;
      }
      // Asked for batch invariance where no batch kernel gives the GEMV's bits: the fused GEMV 8
      // rows at a time.
      if (path == MatmulPath::kGemvRowGroups || path == MatmulPath::kBatchRowGroups) {
        for_row_groups(T, rows_per_group(path), [&](int64_t first, int64_t n) {
          gated_gelu(x.rows_view(first, n), w_gate, w_up, out.rows_view(first, n));
        });
        return;
      }
    }
    // Larger chunks (or gate and up of different types, or in Q4_0 records): two matmuls, the up
    // projection into the workspace's buffer, then the GELU-mul. reserve_forward sized it for the
    // runner's forwards; an op called outside a runner grows it here (never while capturing).
    workspace_.reserve_up(up_values(T, N));
    Tensor up = workspace_.up;  // its first T · N values as [T, N]
    up.rows = T;
    up.cols = N;
    const Tensor ws[] = {w_gate, w_up}, ys[] = {out, up};
    const bool records = all_take(x, ws, ys, kMaxSliceSums, {MatmulPath::kRecords});
    if (records && fusion_) return records_matmuls(x, ws, ys, ptr<bf16>(out));
    matmuls_with(x, planes, ws, ys);
    launch_gelu_tanh_mul(ptr<bf16>(out), ptr<bf16>(up), ptr<bf16>(out), out.numel(), stream_);
  }

  // residual_norm, quantizing next_out into `planes` too when not null (planes_for).
  void residual_norm_with(const Tensor& x, const Tensor& o, const Tensor& post_weight, const Tensor& scalar, float eps,
                          const Tensor& next_weight, const Tensor& next_out, uint4* planes) {
    expect_dtype(x, DType::BF16, "residual_norm input");
    expect_dtype(o, DType::BF16, "residual_norm block output");
    launch_residual_norm(ptr<bf16>(x), ptr<bf16>(o), x.rows, x.cols, optional_f32(post_weight, "residual_norm weight"),
                         optional_f32(scalar, "residual_norm scalar"), eps,
                         optional_f32(next_weight, "residual_norm next weight"),
                         next_out.empty() ? nullptr : ptr<bf16>(next_out), planes, stream_);
  }

  // projected_residual_norm of `a` with its planes `a_planes` (or none), quantizing next_out into
  // next_planes too when not null; returns the planes it wrote (null: none). Over Q4_0 records, the
  // matmul's slices are summed by the norm's launch (as add_slices stores them, o included), which
  // writes no planes.
  const uint4* projected_residual_norm_with(const Tensor& a, const uint4* a_planes, const Tensor& w, const Tensor& o,
                                            const Tensor& x, const Tensor& post_weight, const Tensor& scalar,
                                            float eps, const Tensor& next_weight, const Tensor& next_out,
                                            uint4* next_planes) {
    if (fusion_ && x.dtype == DType::BF16 && o.dtype == DType::BF16 && x.rows == o.rows && x.cols == o.cols &&
        (next_out.empty() || (next_out.dtype == DType::BF16 && next_out.rows == x.rows && next_out.cols == x.cols))) {
      const ResidualNormTail tail{ptr<bf16>(x), optional_f32(post_weight, "residual_norm weight"),
                                  optional_f32(scalar, "residual_norm scalar"), eps,
                                  optional_f32(next_weight, "residual_norm next weight"),
                                  next_out.empty() ? nullptr : ptr<bf16>(next_out)};
      const Tensor ws[] = {w}, ys[] = {o};
      if (all_take(a, ws, ys, 1, {MatmulPath::kRecords})) {
        records_matmuls(a, ws, ys, nullptr, &tail);
        return nullptr;
      }
    }
    matmul_with(a, a_planes, w, o);
    residual_norm_with(x, o, post_weight, scalar, eps, next_weight, next_out, next_planes);
    return next_planes;
  }

  // end_block of `a` with its planes (or none): the residual norm quantizes next_out alongside for
  // the readers when it is one row.
  void end_block_with(const BlockEnd& e, const uint4* a_planes) {
    const bool read = !e.next.empty() && !e.next_out.empty();
    uint4* next_planes = read ? planes_for(e.next_out, e.x.rows == 1) : nullptr;
    const uint4* planes = next_planes;
    if (e.complete_o) {
      matmul_with(e.a, a_planes, e.w, e.o);
      e.complete_o(e.o);
      residual_norm_with(e.x, e.o, e.post_weight, e.scalar, e.eps, e.next_weight, e.next_out, next_planes);
    } else {
      planes = projected_residual_norm_with(e.a, a_planes, e.w, e.o, e.x, e.post_weight, e.scalar, e.eps,
                                            e.next_weight, e.next_out, next_planes);
    }
    if (!read) return;
    if (e.next.gated_gelu) {
      G4_CHECK(e.next.ws.size() == 2 && e.next.ys.size() == 1, "end_block: a gated GELU reads gate and up into one output");
      return gated_gelu_with(e.next_out, planes, e.next.ws[0], e.next.ws[1], e.next.ys[0]);
    }
    matmuls_with(e.next_out, planes, e.next.ws, e.next.ys);
  }


  void softcap(const Tensor& x, float cap, const Tensor& out) override {
    expect_dtype(out, DType::F32, "softcap output");
    launch_softcap(ptr<bf16>(x), x.numel(), cap, ptr<float>(out), stream_);
  }

  void fill_uniform(const Tensor& t, float center, float spread, uint64_t seed) override {
    if (is_block_quantized(t.dtype)) {
      G4_CHECK(center == 0.0f, "fill_uniform: block-quantized tensors are filled around 0");
      launch_fill_random_blocks(t.dtype, ptr<uint8_t>(t), t.rows, t.cols, spread, seed, stream_);
    } else {
      G4_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16,
               "fill_uniform: F32, BF16 or block-quantized tensors only");
      if (t.dtype == DType::F32) {
        launch_fill_uniform(ptr<float>(t), t.numel(), center, spread, seed, stream_);
      } else {
        launch_fill_uniform(ptr<bf16>(t), t.numel(), center, spread, seed, stream_);
      }
    }
    rewritten(t);
  }

  void sample(const Tensor& logits, const SamplingRows& params, const Tensor& tokens) override {
    expect_dtype(logits, DType::F32, "sample logits");
    G4_CHECK(logits.rows == tokens.rows || logits.rows == 1, "sample: one logits row per token, or one for all");
    G4_CHECK(params.rows >= tokens.rows, "sample: one SamplingParams per row");
    CudaSampleBatch batch;
    batch.logits = ptr<float>(logits);
    batch.logits_row_stride = logits.rows == 1 ? 0 : logits.cols;
    batch.rows = tokens.rows;
    batch.vocab = logits.cols;
    batch.params = params.as<SamplingParams>();
    batch.tokens = ptr<int64_t>(tokens);
    batch.advance_seed = capturing_;
    sampler_for(logits.cols).sample(batch, stream_);
  }

  // The bonus draw of the last row into verdict[1], the distributions of the target's and the
  // drafter's rows (CudaSampler::describe), then the verdict kernel (draft_verdict.h).
  void judge_drafts(const Tensor& target_logits, const DraftRows& drafts, const SamplingRows& params,
                    const Tensor& verdict) override {
    check_judge_drafts(target_logits, drafts, params, verdict);
    const int64_t k = drafts.count, V = target_logits.cols;
    const CudaSampler& sampler = sampler_for(V);
    const size_t distribution_bytes = size_t(2 * k) * sizeof(RowDistribution);
    if (distributions_.bytes() < distribution_bytes) distributions_ = DeviceBuffer(distribution_bytes);
    RowDistribution* p = distributions_.as<RowDistribution>();
    auto* rows = params.as<SamplingParams>();
    int64_t* out = ptr<int64_t>(verdict);
    CudaSampleBatch batch;
    batch.vocab = V;
    batch.logits = ptr<float>(target_logits) + k * V;
    batch.rows = 1;
    batch.params = rows + k;
    batch.tokens = out + 1;
    sampler.sample(batch, stream_);
    batch.logits = ptr<float>(target_logits);
    batch.logits_row_stride = V;
    batch.rows = k;
    batch.params = rows;
    sampler.describe(batch, p, stream_);
    batch.logits = ptr<float>(drafts.logits) + drafts.first * V;
    batch.logits_row_stride = drafts.step * V;
    sampler.describe(batch, p + k, stream_);
    DraftVerdictLaunch a;
    a.target = ptr<float>(target_logits);
    a.draft = batch.logits;
    a.draft_stride = batch.logits_row_stride;
    a.vocab = V;
    a.drafts = ptr<int64_t>(drafts.tokens) + drafts.first;
    a.draft_step = drafts.step;
    a.count = int(k);
    a.params = rows;
    a.p = p;
    a.q = p + k;
    a.verdict = out;
    launch_draft_verdict(a, stream_);
  }

  void adjust_logits(const Tensor& logits, const AdjustmentRows& rows) override {
    expect_dtype(logits, DType::F32, "adjust_logits logits");
    G4_CHECK(logits.rows == rows.rows, "adjust_logits: one logits row per row");
    launch_adjust_logits(ptr<float>(logits), rows.rows, logits.cols,
                         static_cast<const LogitAdjustment*>(rows.entries.data), ptr<int32_t>(rows.offsets), stream_);
  }

  void mask_logits(const Tensor& logits, const TokenMaskRows& rows) override {
    expect_dtype(logits, DType::F32, "mask_logits logits");
    G4_CHECK(logits.rows == rows.rows, "mask_logits: one logits row per row");
    launch_mask_logits(ptr<float>(logits), rows.rows, logits.cols, static_cast<const uint32_t*>(rows.words.data),
                       rows.words.cols, ptr<int32_t>(rows.row_mask), stream_);
  }

  void synchronize() override { G4_CUDA(cudaStreamSynchronize(stream_)); }
  void* stream_handle() const override { return stream_; }
  void set_profiling(bool on) override {
    synchronize();  // the bracket holds exactly the work queued inside it
    G4_CUDA(on ? cudaProfilerStart() : cudaProfilerStop());
  }
  size_t peak_memory_bytes() const override { return memory_.peak_bytes(); }

  bool records_steps() const override { return true; }
  void begin_capture() override {
    // Relaxed: only this stream's work is recorded; alloc() refuses to run meanwhile (a recording
    // must not allocate, so owners run a forward eagerly before recording it).
    G4_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
  }

  void end_capture(std::unique_ptr<RecordedStep>& step) override {
    G4_CHECK(capturing_, "end_capture without begin_capture");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    G4_CUDA(cudaStreamEndCapture(stream_, &graph));
    auto* recorded = dynamic_cast<CudaGraph*>(step.get());
    cudaGraphExecUpdateResultInfo update{};
    cudaError_t status = recorded ? cudaGraphExecUpdate(recorded->exec, graph, &update) : cudaErrorGraphExecUpdateFailure;
    if (status != cudaSuccess) {  // another topology (or none yet): a new executable graph
      cudaGetLastError();
      auto fresh = std::make_unique<CudaGraph>();
      status = cudaGraphInstantiate(&fresh->exec, graph, 0);
      if (status == cudaSuccess) step = std::move(fresh);
    }
    cudaGraphDestroy(graph);
    G4_CUDA(status);
    static_cast<CudaGraph&>(*step).allocations = allocations_;
  }

  // Any allocation since the recording may have replaced a scratch buffer it reads (they grow with
  // the forwards: workspace_.up, workspace_.rope_table, the packed scratches): conservative, and allocations are rare
  // once a server is warm.
  bool replayable(const RecordedStep& step) const override {
    const auto* recorded = dynamic_cast<const CudaGraph*>(&step);
    return recorded && recorded->allocations == allocations_;
  }

  void replay(const RecordedStep& step) override {
    const auto* recorded = dynamic_cast<const CudaGraph*>(&step);
    G4_CHECK(recorded && recorded->exec, "replay: not a step this backend recorded");
    G4_CUDA(cudaGraphLaunch(recorded->exec, stream_));
    dequantize_must_wait_ = true;  // a captured forward may use the dequantized scratches
  }

  void tokens_to_ids(const Tensor& tokens, const Tensor& ids) override {
    check_tokens_to_ids(tokens, ids);
    launch_tokens_to_ids(ptr<int64_t>(tokens), ptr<int32_t>(ids), tokens.rows, stream_);
  }
  void advance_step(const Tensor& token, const Tensor& ids, const Tensor& positions) override {
    launch_advance_step(ptr<int64_t>(token), ptr<int32_t>(ids), ptr<int32_t>(positions), stream_);
  }

 private:
  // y (column-major view y^T [N, T], leading dimension ldy) = w [N, K] · x^T [K, T], all bf16.
  void gemm(const void* w, const void* x, bf16* y, int64_t N, int64_t T, int64_t K, int64_t ldy) {
    const float one = 1.0f, zero = 0.0f;
    G4_CUBLAS(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w, CUDA_R_16BF, int(K), x,
                           CUDA_R_16BF, int(K), &zero, y, CUDA_R_16BF, int(ldy), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
  }

  WeightLayout layout_of(const Tensor& w) const {
    if (!is_block_quantized(w.dtype)) return WeightLayout::kBf16;
    return in_records(w) ? WeightLayout::kQ4_0Records : WeightLayout::kPacked;
  }
  MatmulPath matmul_path(const Tensor& w, int64_t T, int64_t K) const {
    return choose_matmul_path(w.dtype, layout_of(w), bf16_copy_of(w) != nullptr, T, K, batch_invariant_);
  }
  // Whether one launch takes x · ws[i]^T into ys[i] for every i: at most `most` matrices, each
  // with its output, of x's width, each on one of `paths`.
  bool all_take(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> ys, int most,
                std::initializer_list<MatmulPath> paths) const {
    if (ws.empty() || ws.size() != ys.size() || ws.size() > size_t(most) || x.dtype != DType::BF16) return false;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].cols != x.cols || ys[i].rows != x.rows || ys[i].cols != ws[i].rows) return false;
      if (std::find(paths.begin(), paths.end(), matmul_path(ws[i], x.rows, x.cols)) == paths.end()) return false;
    }
    return true;
  }

  // Matrices in Q4_0 records (all_take ... kRecords) in one launch. With gelu_out, gate and up and
  // the GELU-mul into it; with then_norm, a residual norm after the one matrix
  // (launch_q4_0_records_matmuls).
  void records_matmuls(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> ys,
                       bf16* gelu_out = nullptr, const ResidualNormTail* then_norm = nullptr) {
    RecordsTarget targets[kMaxSliceSums];
    for (size_t i = 0; i < ws.size(); ++i) targets[i] = RecordsTarget{ptr<uint8_t>(ws[i]), ptr<bf16>(ys[i]), ws[i].rows};
    launch_q4_0_records_matmuls(std::span(targets, ws.size()), ptr<bf16>(x), x.rows, x.cols,
                                ptr<float>(workspace_.packed_partials), workspace_.packed_partials.bytes(), stream_,
                                gelu_out, then_norm);
  }

  // Whether `owner` is the allocation `kept` was taken of, not a later one at a freed weight's address.
  static bool same_allocation(const std::weak_ptr<void>& kept, const std::shared_ptr<void>& owner) {
    return !kept.owner_before(owner) && !owner.owner_before(kept);
  }
  bool in_records(const Tensor& w) const {
    const auto it = records_.find(w.data);
    return w.dtype == DType::Q4_0 && it != records_.end() && same_allocation(it->second, w.owner);
  }
  // After t's bytes were written anew (uploaded, filled), t may be a weight: the dequantize stream
  // waits for the write, and a Q4_0 matrix is in the packed layout again (records_), then in records
  // if invariance asks, and its bf16 copy is made again.
  void rewritten(const Tensor& t) {
    dequantize_must_wait_ = true;
    records_.erase(t.data);
    keep_in_records(t);
    keep_bf16_copy(t);
  }

  // Every block-quantized matrix allocated (alloc) whose memory is still held, as a tensor.
  std::vector<Tensor> live_quantized_matrices() {
    std::erase_if(quantized_matrices_, [](const QuantizedMatrix& m) { return m.owner.expired(); });
    std::vector<Tensor> live;
    for (const QuantizedMatrix& m : quantized_matrices_) {
      Tensor w;
      w.dtype = m.dtype;
      w.rows = m.rows;
      w.cols = m.cols;
      w.data = m.data;
      w.owner = m.owner.lock();
      if (w.owner) live.push_back(std::move(w));
    }
    return live;
  }

  // The bf16 copy of the block-quantized matrix w (set_bf16_weight_copies), or null.
  const Tensor* bf16_copy_of(const Tensor& w) const {
    if (bf16_copies_.empty() || !is_block_quantized(w.dtype)) return nullptr;
    const auto it = bf16_copies_.find(w.data);
    return it != bf16_copies_.end() && same_allocation(it->second.of, w.owner) ? &it->second.copy : nullptr;
  }
  // While copies are asked for, (re)makes the bf16 copy of t, a whole block-quantized matrix just
  // written: the values the dequantization of every matmul would give. Allocating it may throw
  // kResourceExhausted (alloc names the bytes).
  void keep_bf16_copy(const Tensor& t) {
    if (!bf16_copies_on_ || !is_block_quantized(t.dtype) || !t.owner) return;
    const Tensor* copy = bf16_copy_of(t);
    if (!copy) {
      bf16_copies_.erase(t.data);
      copy = &bf16_copies_.emplace(t.data, Bf16Copy{t.owner, alloc(DType::BF16, t.rows, t.cols)}).first->second.copy;
    }
    dequantize(t, 0, t.rows, ptr<bf16>(*copy), stream_);
  }
  // Rows [first, first + n) of the block-quantized matrix w as bf16, into out, on `stream`.
  void dequantize(const Tensor& w, int64_t first, int64_t n, bf16* out, cudaStream_t stream) {
    if (in_records(w))
      launch_dequantize_q4_0_records(ptr<uint8_t>(w), w.rows, w.cols, first, n, out, stream);
    else
      launch_dequantize_rows(w.dtype, ptr<uint8_t>(w), w.rows, w.cols, first, n, out, stream);
  }
  // Rearranges t into records when batch invariance asks for it (see choose_matmul_path) and t is
  // a whole Q4_0 matrix of whole records, just written in the packed layout.
  void keep_in_records(const Tensor& t) {
    if (batch_invariant_ && t.dtype == DType::Q4_0 && t.owner && records::fits_records(t.rows, t.cols)) to_records(t);
  }
  // Rearranges the packed Q4_0 matrix w into records in place (false, w untouched, when the memory
  // for the copies it needs is not free): the params plane copied aside, then tiles from the last
  // down, each group's quants staged first. Records of rows [a, b) start at byte a · 18 K / 32, past
  // the packed quants of every row below a, so no row is overwritten before it is read.
  bool to_records(const Tensor& w) {
    if (in_records(w)) return true;
    const int64_t blocks = w.cols / packed::kBlock;
    const size_t qs_bytes = size_t(w.rows * blocks) * 16, params_bytes = size_t(w.rows * blocks) * 2;
    const size_t row_qs = size_t(blocks) * 16;
    const int64_t group = int64_t(kStagingBytes / row_qs) / records::kTileRows * records::kTileRows;
    if (group < records::kTileRows) return false;
    const size_t staging_bytes = workspace_.staging.bytes() >= kStagingBytes ? 0 : kStagingBytes;
    if (free_memory_bytes() < params_bytes + staging_bytes + (size_t(64) << 20)) return false;
    workspace_.reserve_staging(kStagingBytes, false);
    const Tensor& staging = workspace_.staging;
    const Tensor params = alloc(DType::I32, 1, int64_t(params_bytes / 4 + 1));
    uint8_t* data = ptr<uint8_t>(w);
    G4_CUDA(cudaMemcpyAsync(params.data, data + qs_bytes, params_bytes, cudaMemcpyDeviceToDevice, stream_));
    for (int64_t end = w.rows; end > 0;) {
      const int64_t first = std::max<int64_t>(0, end - group);
      G4_CUDA(cudaMemcpyAsync(staging.data, data + size_t(first) * row_qs, size_t(end - first) * row_qs,
                              cudaMemcpyDeviceToDevice, stream_));
      launch_q4_0_records_from_planes(ptr<uint8_t>(staging), ptr<uint8_t>(params), first, end - first, w.cols, data,
                                      stream_);
      end = first;
    }
    G4_CUDA(cudaStreamSynchronize(stream_));  // before `params` is freed
    // A group of up to kMaxSliceSums matrices in one launch needs the sum of theirs.
    workspace_.reserve_packed_partials(kMaxSliceSums * q4_0_records_workspace_bytes(w.rows, w.cols));
    records_[w.data] = w.owner;
    dequantize_must_wait_ = true;
    return true;
  }

  // y's columns [first, first + n) = x · rows [first, first + n) of the packed weight w^T: the rows
  // dequantized to bf16 into the next of the two scratches, then cuBLAS on stream_. The
  // dequantization runs on dequantize_stream_, after the GEMM that last read that scratch and after
  // every op that may have written a weight or used the scratches unseen (a graph replay), so it
  // overlaps the previous chunk's GEMM. A forward being captured keeps to one stream.
  void multiply_dequantized_chunk(const Tensor& x, const Tensor& w, const Tensor& y, int64_t first, int64_t n) {
    const int b = int(dequantized_chunks_++ % 2);
    bf16* scratch = ptr<bf16>(workspace_.dequantized[b]);
    const bool overlap = !capturing_;
    if (overlap && dequantize_must_wait_) {
      G4_CUDA(cudaEventRecord(stream_point_, stream_));
      G4_CUDA(cudaStreamWaitEvent(dequantize_stream_, stream_point_));
      dequantize_must_wait_ = false;
    }
    if (overlap) G4_CUDA(cudaStreamWaitEvent(dequantize_stream_, chunk_read_[b]));
    dequantize(w, first, n, scratch, overlap ? dequantize_stream_ : stream_);
    if (overlap) {
      G4_CUDA(cudaEventRecord(chunk_ready_[b], dequantize_stream_));
      G4_CUDA(cudaStreamWaitEvent(stream_, chunk_ready_[b]));
    }
    gemm(scratch, x.data, ptr<bf16>(y) + first, n, x.rows, w.cols, w.rows);
    if (overlap) G4_CUDA(cudaEventRecord(chunk_read_[b], stream_));
  }

  // Where the kernel writing the one-row activation `out` also quantizes it for the packed GEMV
  // reading it in the same fused op: workspace_.quantized; null (quantized by its reader, if at
  // all) when fusion is off, not `eligible`, or the scratch cannot hold it.
  uint4* planes_for(const Tensor& out, bool eligible) {
    const bool quantize = fusion_ && eligible && out.rows == 1 && out.cols % packed::kBlock == 0 &&
                          quantized_bytes(out) <= workspace_.quantized.bytes();
    return quantize ? ptr<uint4>(workspace_.quantized) : nullptr;
  }
  // A decode attention whose output row is every head's dims in order, heads of whole blocks.
  static bool quantizable_attention(const AttentionLaunch& a, const Tensor& out) {
    return a.head_dim % packed::kBlock == 0 && out.cols == int64_t(a.heads) * a.head_dim;
  }

  static size_t quantized_bytes(const Tensor& x) {
    return size_t(x.rows) * size_t(x.cols / packed::kBlock) * sizeof(packed::ActivationBlock);
  }

  // x [T, K] quantized for the packed GEMV (quantize_activation_block per block of 32): `planes`
  // when the fused op's writer of x quantized it alongside, else quantized now into
  // workspace_.quantized.
  const uint4* quantized_input(const Tensor& x, const uint4* planes) {
    if (planes) return planes;
    G4_CHECK(quantized_bytes(x) <= workspace_.quantized.bytes(), "packed matmul: input wider than any packed weight");
    launch_quantize_activations(ptr<bf16>(x), x.rows, x.cols, ptr<uint4>(workspace_.quantized), stream_);
    return ptr<uint4>(workspace_.quantized);
  }
  // The packed GEMV's: pinned and in the batch GEMV's order while batch invariance is asked for.
  SumOrder sum_order() const { return batch_invariant_ ? SumOrder::kBatchInvariant : SumOrder::kFastest; }

  // The rows a group of kGemvRowGroups (the GEMV's) or kBatchRowGroups (the batch kernels') takes.
  static int64_t rows_per_group(MatmulPath path) {
    return path == MatmulPath::kGemvRowGroups ? kMaxGemvTokens : kMaxPackedMatmulTokens;
  }
  // f(first, n) for the rows of a T-row op in groups of at most `group`, in order.
  template <typename F>
  static void for_row_groups(int64_t T, int64_t group, F&& f) {
    for (int64_t first = 0; first < T; first += group) f(first, std::min<int64_t>(group, T - first));
  }

  // Rows of a K-wide weight that fit a dequantized scratch, a multiple of 64 when more than 64 fit.
  int64_t dequantized_rows_per_chunk(int64_t K) const {
    const int64_t rows = int64_t(workspace_.dequantized[0].bytes() / (2 * size_t(K)));
    G4_CHECK(rows >= 1, "packed matmul: rows of " + std::to_string(K) + " values do not fit the prefill scratch");
    return rows > 64 ? rows / 64 * 64 : rows;
  }

  void concat_cols(std::span<const Tensor> parts, const Tensor& out) override {
    check_concat_cols(parts, out);
    size_t offset = 0;
    for (const Tensor& p : parts) {
      G4_CUDA(cudaMemcpy2DAsync(static_cast<uint8_t*>(out.data) + offset, out.row_size(), p.data, p.row_size(),
                                   p.row_size(), size_t(p.rows), cudaMemcpyDeviceToDevice, stream_));
      offset += p.row_size();
    }
  }

  static void check_head_norms(const HeadNorms& n) {
    expect_dtype(n.q, DType::BF16, "head_norms input");
    expect_dtype(n.inv_freq, DType::F32, "rope inv_freq");
    if (n.k.empty()) {  // an MTP assistant's queries alone
      G4_CHECK(n.v_in.empty() && n.v.empty(), "head_norms: values without keys");
      return;
    }
    for (const Tensor* t : {&n.k, &n.v_in, &n.v}) expect_dtype(*t, DType::BF16, "head_norms input");
    G4_CHECK(n.q.cols == n.k.cols && n.v.cols == n.k.cols && n.v_in.rows == n.v.rows,
             "head_norms: q, k and v heads must have one head_dim");
  }

  void reserve_forward(const ForwardReservation& r) override {
    const int64_t chunk_rows = std::min(r.rows, kMaxChunkRowsOnDecodeKernels);  // attention()'s short chunks
    reserve_decode_attention(r.heads, r.head_dim, std::max(r.decode_sequences, chunk_rows));
    workspace_.reserve_up(up_values(r.rows, r.intermediate));
    workspace_.reserve_rope_table(rope_table_floats(r.rows, r.head_dim));
  }
  // gated_gelu's up projection for T rows of width N (at least kMaxPackedMatmulTokens rows, so that
  // decode steps never grow it); head_norms' rotations of T tokens.
  static int64_t up_values(int64_t T, int64_t N) { return std::max<int64_t>(T, kMaxPackedMatmulTokens) * N; }
  static int64_t rope_table_floats(int64_t T, int head_dim) { return 2 * T * (head_dim / 2); }

  void reserve_decode_attention(int heads, int head_dim, int64_t sequences) {
    AttentionLaunch shape;
    shape.heads = heads;
    shape.head_dim = head_dim;
    const int64_t floats =
        decode_partial_floats(shape, kDecodeSplits) * std::min<int64_t>(sequences, kMaxDecodeSequences);
    workspace_.reserve_attention_partials(floats);
  }

  static bool folds_norms(const HeadNorms& norms, const AttentionArgs& args) {
    return !args.reads_cache_only && args.positions.rows == 1 && args.q_first == 0 && norms.q_first == 0 &&
           norms.q.data == args.q.data &&
           norms.k.data == args.k_new.data && norms.v.data == args.v_new.data && norms.q.cols == args.head_dim;
  }

  // Sequence i's rows are row i of sequence 0's tensors, and the sequences differ only in their
  // caches: what one batched decode launch assumes (sequence_launch in decode_attention.cu).
  static bool decode_rows_in_order(std::span<const HeadNorms> norms, std::span<const AttentionArgs> args) {
    if (args.size() < 2 || norms.size() != args.size() || args[0].reads_cache_only) return false;
    const AttentionArgs& a0 = args[0];
    const HeadNorms& n0 = norms[0];
    // Sequence i's tensor is the i-th of tensors like the first laid end to end (a head-norm view
    // [heads, head_dim] of one token included).
    auto row_of = [](const Tensor& first, int64_t i, const Tensor& t) {
      return t.rows == first.rows && t.cols == first.cols && t.dtype == first.dtype &&
             t.data == static_cast<const uint8_t*>(first.data) + size_t(i) * first.bytes();
    };
    for (size_t i = 0; i < args.size(); ++i) {
      const AttentionArgs& a = args[i];
      const HeadNorms& n = norms[i];
      const int64_t r = int64_t(i);
      if (!folds_norms(n, a) || !row_of(a0.q, r, a.q) || !row_of(a0.k_new, r, a.k_new) ||
          !row_of(a0.v_new, r, a.v_new) || !row_of(n0.v_in, r, n.v_in) || !row_of(a0.out, r, a.out) ||
          !row_of(a0.positions, r, a.positions))
        return false;
      if (a.heads != a0.heads || a.kv_heads != a0.kv_heads || a.head_dim != a0.head_dim || a.window != a0.window ||
          a.scale != a0.scale || a.cache->table.rows != a0.cache->table.rows ||
          a.cache->page_positions != a0.cache->page_positions || a.cache->page_stride != a0.cache->page_stride ||
          a.cache->k.cols != a0.cache->k.cols || a.cache->k.dtype != a0.cache->k.dtype ||
          n.q_weight.data != n0.q_weight.data || n.k_weight.data != n0.k_weight.data ||
          n.inv_freq.data != n0.inv_freq.data || n.eps != n0.eps)
        return false;
    }
    return true;
  }

  // The launch of one decode token with its head norms folded in (see normed_attention).
  AttentionLaunch folded_launch(const HeadNorms& norms, const AttentionArgs& args) {
    check_head_norms(norms);
    AttentionLaunch a = attention_launch(args);
    a.v_new = ptr<bf16>(norms.v_in);
    a.norm_inputs = true;
    a.q_norm_weight = optional_f32(norms.q_weight, "q_norm weight");
    a.k_norm_weight = optional_f32(norms.k_weight, "k_norm weight");
    a.inv_freq = ptr<float>(norms.inv_freq);
    a.norm_eps = norms.eps;
    return a;
  }

  // The splits a decode launch of these sequences needs (launch_decode_attention, or
  // launch_quantized_decode_attention over quantized caches), when the host knows every position
  // and no graph is being captured (a replay runs at later positions); else 0.
  int splits_bound(std::span<const AttentionArgs> args) const {
    int bound = 0;
    for (const AttentionArgs& a : args) {
      if (a.last_position < 0 || capturing_) return 0;
      bound = std::max(bound, is_quantized_kv(a.cache->k.dtype)
                                  ? quantized_decode_splits(a.last_position, a.window, kDecodeSplits)
                                  : decode_attention_splits(a.last_position, a.window, kDecodeSplits));
    }
    return bound;
  }

  static DecodeCaches own_caches(const AttentionLaunch& a) {
    DecodeCaches caches;
    caches.k[0] = a.k_cache;
    caches.v[0] = a.v_cache;
    caches.table[0] = a.page_table;
    return caches;
  }

  // The launch arguments of an attention call; also sizes the decode workspace, on every call,
  // prefill too: a prompt's forward visits every layer before a decode step is captured, so a
  // graph capture never has to allocate.
  AttentionLaunch attention_launch(const AttentionArgs& args) {
    AttentionLaunch a;
    a.q = ptr<bf16>(args.q);
    a.k_new = ptr<bf16>(args.k_new);
    a.v_new = ptr<bf16>(args.v_new);
    a.k_cache = ptr<bf16>(args.cache->k);
    a.v_cache = ptr<bf16>(args.cache->v);
    a.out = ptr<bf16>(args.out);
    a.positions = ptr<int32_t>(args.positions);
    a.T = args.positions.rows;
    a.q_first = args.q_first;
    a.page_table = ptr<int32_t>(args.cache->table);
    a.table_slots = int(args.cache->table.rows);
    a.page_positions = int(args.cache->page_positions);
    a.page_stride = args.cache->page_stride;
    a.heads = args.heads;
    a.kv_heads = args.kv_heads;
    a.head_dim = args.head_dim;
    a.window = args.window;
    a.scale = args.scale;
    a.q_stride = args.q.cols;
    a.kv_stride = int64_t(a.kv_heads) * a.head_dim;
    a.out_stride = args.out.cols;
    G4_CHECK((is_quantized_kv(args.cache->k.dtype) || args.cache->k.cols == a.kv_stride) &&
                 (args.reads_cache_only || args.k_new.cols == a.kv_stride),
             "cuda attention: K/V rows must hold kv_heads * head_dim values");
    if (args.reads_cache_only) {
      // The kernels see the query at P - 1 with a window one shorter: keys (P - window, P - 1].
      G4_CHECK(a.T == 1 && args.k_new.empty() && args.v_new.empty() && args.window != 1 &&
                   args.last_position < 0,
               "cuda attention: queries over a cache alone come one a sequence, with no keys of their own "
               "(and a window of at least 2)");
      a.cache_only = true;
      a.window = args.window > 0 ? args.window - 1 : 0;
    }
    G4_CHECK(a.q_first >= 0 && a.q_first <= a.T && args.q.rows == a.T - a.q_first && args.out.rows == args.q.rows,
             "cuda attention: q and out must hold the chunk's tokens [q_first, T)");
    G4_CHECK(a.T > 1 || a.q_first == 0, "cuda attention: a decode step has its one query");
    reserve_decode_attention(a.heads, a.head_dim, 1);
    return a;
  }

  // The launch of one sequence's attention over a quantized cache (attention_launch's arguments,
  // the cache's rows in their type).
  QuantizedKvLaunch quantized_launch(const AttentionArgs& args) {
    const KvCache& cache = *args.cache;
    for (const Tensor* t : {&args.q, &args.out}) expect_dtype(*t, DType::BF16, "attention input");
    for (const Tensor* t : {&args.k_new, &args.v_new})
      if (!args.reads_cache_only) expect_dtype(*t, DType::BF16, "attention input");
    G4_CHECK(cache.v.dtype == cache.k.dtype && cache.v.cols == cache.k.cols &&
                 cache.k.cols == kv_cache_cols(cache.k.dtype, args.kv_heads, args.head_dim),
             "cuda attention: a " + dtype_name(cache.k.dtype) +
                 " cache's K and V rows must hold kv_heads heads of head_dim values");
    QuantizedKvLaunch q;
    q.a = attention_launch(args);
    q.dtype = cache.k.dtype;
    q.row_bytes = int64_t(cache.k.row_size());
    q.caches.k[0] = ptr<uint8_t>(cache.k);
    q.caches.v[0] = ptr<uint8_t>(cache.v);
    q.caches.table[0] = ptr<int32_t>(cache.table);
    q.last_position = args.last_position;
    return q;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  CudaWorkspace workspace_;
  bool batch_invariant_ = false;  // set_batch_invariant
  // Q4_0 weights rearranged into records (to_records), by their data, with their owner.
  std::unordered_map<const void*, std::weak_ptr<void>> records_;
  // Every block-quantized matrix allocated (alloc): batch invariance keeps the Q4_0 ones of whole
  // records in records, and bf16 copies are made of all.
  struct QuantizedMatrix {
    void* data;
    DType dtype;
    int64_t rows, cols;
    std::weak_ptr<void> owner;
  };
  std::vector<QuantizedMatrix> quantized_matrices_;
  // bf16 copies of block-quantized matrices (set_bf16_weight_copies), by the matrix's data, with
  // the matrix's owner.
  struct Bf16Copy {
    std::weak_ptr<void> of;
    Tensor copy;
  };
  bool bf16_copies_on_ = false;
  std::unordered_map<const void*, Bf16Copy> bf16_copies_;
  // Prefill over packed weights (multiply_dequantized_chunk): the chunks dequantized so far (which
  // picks the scratch of workspace_.dequantized), the stream that fills them, and the events that order it: a chunk ready for its GEMM, a scratch read
  // by its GEMM, and a point of stream_ the dequantize stream must not overtake (set after an op
  // that may have written a weight or replayed a graph: dequantize_must_wait_).
  int64_t dequantized_chunks_ = 0;
  cudaStream_t dequantize_stream_ = nullptr;
  cudaEvent_t chunk_ready_[2] = {}, chunk_read_[2] = {}, stream_point_ = nullptr;
  bool dequantize_must_wait_ = false;
  bool fusion_ = true;  // set_fusion
  // The sampler, made for the widest logits rows seen (sample, judge_drafts).
  const CudaSampler& sampler_for(int64_t vocab) {
    if (!sampler_ || sampler_->max_vocab() < vocab) sampler_ = std::make_unique<CudaSampler>(vocab);
    return *sampler_;
  }
  std::unique_ptr<CudaSampler> sampler_;
  DeviceBuffer distributions_;  // judge_drafts: the rows' RowDistribution
  HostStaging host_staging_;    // download_rows, upload_rows
  MemoryMeter memory_;
  bool capturing_ = false;
  uint64_t allocations_ = 0;  // alloc() calls so far (CudaGraph::allocations)
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  const int count = cuda_device_count();
  G4_CHECK(count > 0, "no CUDA GPU is present on this machine");
  if (device >= 0) {
    G4_CHECK(device < count, "CUDA device " + std::to_string(device) + " requested, but only " +
                                 std::to_string(count) + " present");
    G4_CUDA(cudaSetDevice(device));
  }
  return std::make_unique<CudaBackend>();
}

}  // namespace g4
