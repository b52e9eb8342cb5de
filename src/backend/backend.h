// The small interface the Gemma 4 forward is written against, once. The CPU backend (float32
// arithmetic) and the CUDA backend (bf16 activations, float32 accumulation) implement it.
//
// Conventions: activations are 2-D tensors [rows, cols] in activation_dtype(); weights are
// [out, in] (the checkpoint layout) in whatever storage type the backend chose when uploading;
// token ids and positions are I32 tensors [T, 1] in backend memory, so that a captured CUDA graph
// reads them from device memory on every replay.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "backend/tensor.h"
#include "sampling/logit_penalties.h"
#include "sampling/sampling_params.h"
#include "util/error.h"

namespace g4 {

struct HostTensor;  // format/tensor_source.h
class Backend;

// One verify chunk's K drafts where a drafter left them: draft i (i < count) is row first + i·step
// of `tokens` (I64 [*, 1]) and was drawn from the same row of `logits` (F32 [*, V]; unread for
// greedy draws).
struct DraftRows {
  Tensor tokens, logits;
  int64_t first = 0, step = 1, count = 0;
};

// Per-row sampling parameters in backend memory: `rows` SamplingParams, the one layout host and
// device share (sampling/sampling_params.h). Made by Backend::alloc_sampling_rows and written by
// Backend::upload_sampling_rows; Backend::sample reads row r for output row r.
struct SamplingRows {
  Tensor storage;  // its bytes, as whole I32 words
  int64_t rows = 0;
  SamplingRows first(int64_t n) const;                   // the first n rows (n <= rows)
  SamplingRows slice(int64_t first_row, int64_t n) const;  // rows [first_row, first_row + n)
  template <typename T>
  T* as() const {
    static_assert(std::is_same_v<std::remove_const_t<T>, SamplingParams>, "sampling rows hold SamplingParams");
    return static_cast<T*>(storage.data);
  }
};

// Per-row logit adjustments in backend memory (sampling/logit_penalties.h): row r's are the
// LogitAdjustments [offsets[r], offsets[r + 1]) of `entries`, each token at most once per row.
struct AdjustmentRows {
  Tensor entries;  // LogitAdjustment records, as whole I32 words
  Tensor offsets;  // I32 [rows + 1, 1]
  int64_t rows = 0;
};

// Token masks in backend memory (constrained decoding, grammar/matcher.h's layout): `words` holds
// masks of `words.cols` 32-bit words, bit t of word t/32 set when token t is allowed; row r of a
// forward's draws uses mask row_mask[r], or none when it is -1. I32 tensors.
struct TokenMaskRows {
  Tensor words;     // [masks, words per mask]
  Tensor row_mask;  // [rows, 1]
  int64_t rows = 0;
};

// The largest forward a backend is asked to run, so that it can size its scratch buffers once,
// before any forward (a forward being captured into a graph must not allocate).
struct ForwardReservation {
  int64_t rows = 0;          // tokens one forward holds
  int64_t decode_sequences = 0;  // sequences one decode batch holds
  int heads = 0, head_dim = 0;   // attention: query heads and the widest head
  int64_t intermediate = 0;  // the MLP's width
};

// One layer's KV cache of one sequence, in pages (docs/DESIGN.md §7): the K row of position p is
// row page_row(p) of `k` and its V row the same row of `v`, where
//   page_row(p) = table[(p / page_positions) % slots] * page_stride + p % page_positions,
// slots = table.rows. The KV pool's pages hold the K rows of their positions, then the V rows (v is
// k offset by page_positions rows, page_stride = 2 * page_positions); a sliding layer's table is a
// ring of pages, a full layer's has a slot for every page of the context. The table (I32 [slots,
// 1], in backend memory) names a page only where the sequence holds one: the host keeps it so
// that every position an attention reads or stores has its page.
// k.dtype is the cache's row type (kv_cache_cols): the activation dtype, or a quantized one (Q8_0,
// TQ4) whose rows attention stores and reads in that form.
struct KvCache {
  Tensor k, v;
  Tensor table;
  int64_t page_positions = 0, page_stride = 0;
  // Positions the table reaches before it wraps (the ring a sliding layer reads back from).
  int64_t capacity() const { return table.rows * page_positions; }
};

// A KV row holds a layer's kv_heads head vectors of one position (K or V), as kv_cache_cols
// elements of its type: unquantized, kv_heads * head_dim values in the activation dtype; Q8_0, the
// same values in GGUF's blocks of 32; TQ4 (elements are bytes), each head's head_dim / 2 code bytes
// (quant/tq4.h), head after head, then each head's bf16 norm, padded to a multiple of 16 bytes so
// that every row of a page starts 16-byte aligned. Throws Error(kInvalidArgument) for a head_dim
// the type cannot hold (Q8_0: a multiple of 32; TQ4: a power of two).
int64_t kv_cache_cols(DType dtype, int kv_heads, int head_dim);
inline bool is_quantized_kv(DType dtype) { return dtype == DType::Q8_0 || dtype == DType::TQ4; }

// A cache of k.rows positions in one page of its own (position p in row p % k.rows): a ring for a
// sliding layer, flat for a full one. For kernels' tests and benchmarks.
KvCache one_page_kv_cache(Backend& backend, Tensor k, Tensor v);
// The same over new K and V tensors of `capacity` rows.
KvCache one_page_kv_cache(Backend& backend, DType dtype, int64_t capacity, int64_t kv_cols);

// The queries are the chunk's tokens [q_first, T): a chunk may skip those whose output nobody
// reads (the last layer of a prompt), while every token's K/V is still attended and stored.
// Over a quantized cache (is_quantized_kv), the chunk's K/V rows are stored first and every key and
// value is read as the cache holds it, the chunk's own too: a token attends to the same values
// however its context was chunked (the ring of a sliding layer must then hold window + T - 1
// positions, as the KV pool's rings do).
struct AttentionArgs {
  Tensor q;          // [T - q_first, heads*head_dim], normed and rotated
  Tensor k_new, v_new;  // [T, kv_heads*head_dim] of this chunk, normed (and K rotated)
  const KvCache* cache;  // keys/values of positions before this chunk
  Tensor positions;  // I32 [T, 1], contiguous: positions[i] = positions[0] + i
  int heads = 0, kv_heads = 0, head_dim = 0;
  int window = 0;    // sliding window (pos_q - pos_k < window); 0 = full causal
  float scale = 1.0f;
  Tensor out;        // [T - q_first, heads*head_dim]
  int64_t q_first = 0;
  int64_t last_position = -1;  // positions[T - 1] when the host knows it (-1: not known), so that a
                               // backend can size a launch to the keys there are
  // Queries of an MTP assistant (model/assistant.h) over its target's cache: k_new and v_new are
  // empty and nothing is stored; query row t at positions[t] reads the cached keys p with
  // p < positions[0] (and positions[t] - p < window), which must be at least one.
  bool reads_cache_only = false;
  // Every row of the chunk is read out (a speculative verify chunk: each row's hidden state decides a
  // token), so each row is attended as a decode step at its position would be; a backend may run such
  // short chunks on its decode kernels (CUDA: row_routing.h), giving each row a decode step's result.
  // Prompt chunks keep their own kernels, whose rows do not depend on how a prompt is chunked.
  bool rows_as_decode_steps = false;
};

// The attention block's per-head norms, in place on [tokens*heads, head_dim] views (row r of a
// tensor belongs to token r / heads; q holds tokens [q_first, T), k and v all T):
// q = rope(rms_norm(q)·q_weight) and k = rope(rms_norm(k)·k_weight), rotate-half RoPE with inv_freq
// F32 [head_dim/2, 1] (zeros = identity, which is how proportional partial RoPE is expressed) at
// positions[token]; v = rms_norm(v_in) without weight, where v_in is the projected V (in place:
// v_in = v) or, on K=V layers, the projected K itself (read before k is normed). An MTP assistant's
// queries come alone: k, v and v_in empty.
struct HeadNorms {
  Tensor q, q_weight, k, k_weight, v_in, v;
  Tensor positions, inv_freq;
  float eps = 0.0f;
  int64_t q_first = 0;
};

// The matrices that read an activation, named in the fused op that writes it (Backend::end_block,
// Backend::normed_attention_then): ys[i] = in · ws[i]^T (matmuls), or, with gated_gelu, the gated
// MLP's first half ys[0] = gelu_tanh(in · ws[0]^T) * (in · ws[1]^T) (gated_gelu).
struct Readers {
  std::span<const Tensor> ws, ys;
  bool gated_gelu = false;
  bool empty() const { return ws.empty(); }
};

// The end of a residual block and what reads its result: o = a · w^T, completed by complete_o when
// set (a tensor-parallel rank's sum of every rank's partial o), then residual_norm(x, o,
// post_weight, scalar, eps, next_weight, next_out), then `next` reading next_out (nothing when
// either is empty).
struct BlockEnd {
  Tensor a, w, o, x, post_weight, scalar;
  float eps = 0.0f;
  Tensor next_weight, next_out;
  Readers next;
  std::function<void(const Tensor&)> complete_o;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DType activation_dtype() const = 0;

  // ---- memory ----
  virtual Tensor alloc(DType dtype, int64_t rows, int64_t cols) = 0;
  virtual void upload(const void* host, const Tensor& dst) = 0;   // host bytes already in dst.dtype
  virtual void download(const Tensor& src, void* host) = 0;       // waits for pending work
  // Rows `rows` of src, in that order, into host memory back to back, with one wait for all of
  // them; and back: host rows back to back into rows `rows` of dst. What swapping a sequence's KV
  // pages out and in takes: thousands of scattered rows, where a copy and a wait each would cost
  // the bus's latency every row (the CUDA backend stages them through pinned memory).
  virtual void download_rows(const Tensor& src, std::span<const int32_t> rows, void* host);
  virtual void upload_rows(const void* host, std::span<const int32_t> rows, const Tensor& dst);
  // Make a weight usable by matmul/embed/norm ops. `storage` is the type the caller wants kept
  // (the file's type, or F32); the backend may pick its own (e.g. CUDA keeps BF16).
  virtual Tensor upload_weight(const HostTensor& w) = 0;
  // Whether upload_weight takes weights stored as `t`; loaders ask before allocating anything.
  virtual bool runs_weight_dtype(DType t) const = 0;
  // Whether attention reads and stores KV caches of row type `t` (KvCache); the KV pool asks before
  // allocating its pages. The activation dtype always.
  virtual bool runs_kv_dtype(DType t) const { return t == activation_dtype(); }
  // Bytes of backend memory upload_weight(w) will allocate, and the memory free for allocations:
  // loaders check that the weights fit before allocating any, and the KV pool takes at most the
  // free memory (on the CPU, weights are used in place from the mapped file, and the free memory
  // is what the host can still give).
  virtual size_t weight_bytes_on_backend(const HostTensor& w) const = 0;
  virtual size_t free_memory_bytes() const = 0;

  // ---- ops ----
  // out[i] = table[ids[i]] * scale (scale applied in the activation dtype).
  virtual void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) = 0;
  // Per-row RMSNorm over cols: out = x / sqrt(mean(x^2) + eps) * weight (weight may be empty).
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) = 0;
  // y[T, out] = x[T, in] · w[out, in]^T
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  // ys[i] = x · ws[i]^T for every i: projections of one input (q/k/v), which a backend may stream
  // in one launch.
  virtual void matmuls(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> ys) {
    G4_CHECK(ws.size() == ys.size(), "matmuls: one output per weight");
    for (size_t i = 0; i < ws.size(); ++i) matmul(x, ws[i], ys[i]);
  }
  // out[r] = parts[0][r] | parts[1][r] | ...: rows side by side (same dtype and rows; out.cols the
  // sum of theirs). An MTP assistant's input is the target's embedding beside its hidden state.
  virtual void concat_cols(std::span<const Tensor> parts, const Tensor& out) = 0;
  // What every backend's concat_cols checks first: one dtype and row count, the columns adding up.
  static void check_concat_cols(std::span<const Tensor> parts, const Tensor& out);
  // download_rows / upload_rows: every row inside t.
  static void check_rows(const Tensor& t, std::span<const int32_t> rows);
  // The attention block's q/k/v head norms and RoPE (see HeadNorms).
  virtual void head_norms(const HeadNorms& args) = 0;
  // Causal (optionally sliding-window) GQA attention of the chunk's queries over the cached
  // positions before the chunk and the chunk's own keys, then stores the chunk's K/V in the cache.
  virtual void attention(const AttentionArgs& args) = 0;
  // head_norms(norms), then attention(args), whose q/k_new/v_new are the normed tensors. A backend
  // may fuse the two (CUDA does for one decode token); the results are then args.out and the cache,
  // and q/k/v may be left un-normed.
  virtual void normed_attention(const HeadNorms& norms, const AttentionArgs& args) {
    head_norms(norms);
    attention(args);
  }
  // Sizes the scratch buffers of forwards up to `r` (CUDA: decode attention's split-K partials, the
  // up projection of a gated GELU, the rotation table), so that no forward allocates; nothing on
  // the CPU.
  virtual void reserve_forward(const ForwardReservation& /*r*/) {}
  // normed_attention(norms[i], args[i]) for every sequence i of a forward. A backend may run a
  // decode batch (one token per sequence) in one launch (CUDA does), each sequence's result the
  // same as alone.
  virtual void normed_attention_batch(std::span<const HeadNorms> norms, std::span<const AttentionArgs> args) {
    G4_CHECK(norms.size() == args.size(), "normed_attention_batch: one HeadNorms per sequence");
    for (size_t i = 0; i < args.size(); ++i) normed_attention(norms[i], args[i]);
  }
  // The gated MLP's first half: out[T, I] = gelu_tanh(x · w_gate^T) * (x · w_up^T), w_* [I, H].
  virtual void gated_gelu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& out) = 0;
  // The end of a residual block, per row: x = (x + rms_norm(o)·post_weight) · scalar[0] (no scaling
  // when scalar is empty); then, unless next_out is empty, next_out = rms_norm(x)·next_weight, the
  // next block's normed input (next_weight may be empty: no weight). o is only read.
  virtual void residual_norm(const Tensor& x, const Tensor& o, const Tensor& post_weight, const Tensor& scalar,
                             float eps, const Tensor& next_weight, const Tensor& next_out) = 0;
  // A residual block's projection and end: o = a · w^T, then residual_norm(x, o, ...). In one call,
  // a backend may hand the projection's partial sums to the norm without storing them first (CUDA,
  // Q4_0 records); o holds the projection afterwards either way, with the same bits.
  virtual void projected_residual_norm(const Tensor& a, const Tensor& w, const Tensor& o, const Tensor& x,
                                       const Tensor& post_weight, const Tensor& scalar, float eps,
                                       const Tensor& next_weight, const Tensor& next_out) {
    matmul(a, w, o);
    residual_norm(x, o, post_weight, scalar, eps, next_weight, next_out);
  }
  // in · the readers' matrices: matmuls(in, ws, ys), or gated_gelu(in, ws[0], ws[1], ys[0]).
  void run_readers(const Tensor& in, const Readers& r) {
    if (!r.gated_gelu) return matmuls(in, r.ws, r.ys);
    G4_CHECK(r.ws.size() == 2 && r.ys.size() == 1, "run_readers: a gated GELU reads gate and up into one output");
    gated_gelu(in, r.ws[0], r.ws[1], r.ys[0]);
  }

  // ---- fused ops: an op and the ops that read its output in one call, so that a backend may hand
  // the output over in another form as well, inside the call (CUDA: a one-row output quantized for
  // the packed GEMV by the kernel that writes it). The results are those of the ops in sequence. ----
  // The end of a residual block and its readers (BlockEnd).
  virtual void end_block(const BlockEnd& e) {
    if (e.complete_o) {
      matmul(e.a, e.w, e.o);
      e.complete_o(e.o);
      residual_norm(e.x, e.o, e.post_weight, e.scalar, e.eps, e.next_weight, e.next_out);
    } else {
      projected_residual_norm(e.a, e.w, e.o, e.x, e.post_weight, e.scalar, e.eps, e.next_weight, e.next_out);
    }
    if (!e.next.empty() && !e.next_out.empty()) run_readers(e.next_out, e.next);
  }
  // normed_attention_batch(norms, args), then end_block(end), whose `a` is the attention's output
  // (the rows of every args[i].out).
  virtual void normed_attention_then(std::span<const HeadNorms> norms, std::span<const AttentionArgs> args,
                                     const BlockEnd& end) {
    normed_attention_batch(norms, args);
    end_block(end);
  }
  // Fusion on (the default), a backend may run a fused op, and its own fusions of one op (CUDA: the
  // head norms folded into decode attention; a Q4_0 records matmul's GELU-mul or residual norm in
  // its launch), in one piece; off, it runs their parts as separate ops: the same tokens, slower
  // (for debugging). Backends that fuse nothing ignore it.
  virtual void set_fusion(bool /*on*/) {}

  // out (F32) = cap * tanh(x / cap), or a plain copy when cap <= 0; x is in the activation dtype.
  virtual void softcap(const Tensor& x, float cap, const Tensor& out) = 0;
  // t[i] = center + spread * uniform_hash(seed, i) for F32 or BF16 t; for a block-quantized t
  // (center 0), GGUF block i = random_block(t.dtype, random_block_scales(t.dtype, spread), seed, i)
  // (quant/random_blocks.h): weights spread over about ±spread. The same values on every backend
  // (synthetic weights for benchmarks and tests).
  virtual void fill_uniform(const Tensor& t, float center, float spread, uint64_t seed) = 0;
  // Samples I64 tokens [B, 1], row r from row r of F32 logits [B, V] (or from the one row of
  // logits [1, V], shared by every row) with row r of `params` (at least B rows).
  // Each row's seed is read from params (see sampling_params.h). A row whose logits hold a NaN
  // draws kNanLogitsToken and the others draw as usual: sampling never fails for a row's logits.
  virtual void sample(const Tensor& logits, const SamplingRows& params, const Tensor& tokens) = 0;
  // Row r of F32 logits [rows, V]: each listed token's logit becomes adjusted_logit(logit, its
  // adjustment) (logit_bias and penalties), in place, before the draw.
  virtual void adjust_logits(const Tensor& logits, const AdjustmentRows& rows) = 0;
  // Row r of F32 logits [rows, V] with a mask: every token the mask does not allow (and every token
  // past its words) becomes -infinity, in place, after adjust_logits and before the draw.
  virtual void mask_logits(const Tensor& logits, const TokenMaskRows& rows) = 0;
  SamplingRows alloc_sampling_rows(int64_t rows);
  void upload_sampling_rows(std::span<const SamplingParams> rows, const SamplingRows& dst);
  virtual void synchronize() = 0;
  // The queue this backend's ops run on, for a communicator that enqueues collectives among them
  // (docs/DESIGN.md, "Tensor parallel"): CUDA's cudaStream_t; nullptr where ops run at once (CPU).
  virtual void* stream_handle() const { return nullptr; }
  // Brackets the work a profiler records (CUDA: cudaProfilerStart/Stop, for ncu --profile-from-start
  // off); nothing where there is no such profiler.
  virtual void set_profiling(bool /*on*/) {}
  // Peak bytes of backend memory allocated so far (device memory on CUDA; on the CPU, buffers
  // only: mapped weights are not allocations).
  virtual size_t peak_memory_bytes() const = 0;
  // The most rows an op may take while every row's result stays bit-identical to running that row
  // alone (docs/DESIGN.md §7, batch invariance): the scheduler runs decode rows in groups of at most
  // this many. 1 (assume nothing) unless a backend knows better.
  virtual int64_t batch_invariant_rows() const { return 1; }
  // Asks for batch invariance over as many rows as the backend can give it at any cost (on for a
  // batch-invariant scheduler): batch_invariant_rows() then says how many. Off (the default), ops
  // take the fastest kernels. Backends whose every op is row by row ignore it.
  virtual void set_batch_invariant(bool) {}
  // Asks for a bf16 copy of every block-quantized weight beside it (made now for those already
  // written, and whenever one is written), which matmuls of many rows multiply instead of
  // dequantizing the weight each time: memory (2 bytes a weight) for the speed of large batches
  // and prefill. Throws kResourceExhausted when a copy does not fit, and kUnsupported where the
  // backend multiplies quantized weights without dequantizing them (the default).
  virtual void set_bf16_weight_copies(bool on);

  // ---- graphs: a step recorded once, replayed with its inputs in backend memory ----
  // A recorded step (a CUDA graph), owned by whoever recorded it; replays read the memory it was
  // recorded over (inputs, caches, outputs), so the owner records again when that memory changes.
  class RecordedStep {
   public:
    virtual ~RecordedStep() = default;
  };
  // Ops issued between begin_capture() and end_capture() are recorded instead of run; replay() runs
  // a recorded step (in order with the other ops). A sample() recorded in a capture also advances
  // each row's seed in `params` after its draw, so replays follow the seed schedule (token j uses
  // seed + j). Backends without graphs (records_steps() false) throw g4::Error.
  virtual bool records_steps() const { return false; }
  virtual void begin_capture() = 0;
  // Ends the capture into `step`: a new recording when it is empty; else `step` itself, updated in
  // place when the ops are the same launches with other arguments (cheaper than a new one), or
  // replaced.
  virtual void end_capture(std::unique_ptr<RecordedStep>& step) = 0;
  // Whether `step` still reads live buffers: a backend replaces its scratch buffers as forwards
  // outgrow them, so its owner records again when this is false.
  virtual bool replayable(const RecordedStep& /*step*/) const { return false; }
  virtual void replay(const RecordedStep& step) = 0;
  // The step advance that ends a captured step: ids[0] = int32(token[0]); positions[0] += 1. After
  // a kNanLogitsToken the ids are no token: the caller must not replay again (DecodeGraph::next).
  virtual void advance_step(const Tensor& token, const Tensor& ids, const Tensor& positions) = 0;
  // Drawn tokens as the next step's inputs, on the device: ids[r] = int32(tokens[r]) for tokens I64
  // [n, 1] and ids I32 [n, 1]; a row that drew no token (kNanLogitsToken) gets id 0, so that a
  // chain of steps runs on (the caller discards what follows that row's failed draw).
  virtual void tokens_to_ids(const Tensor& tokens, const Tensor& ids) = 0;
  // What every backend's tokens_to_ids checks first: I64 and I32 columns of one row count.
  static void check_tokens_to_ids(const Tensor& tokens, const Tensor& ids);
  // The speculative verdict on one verify chunk (sampling/speculative.h's judge_drafts, on backend
  // memory): target_logits F32 [K + 1, V] are the chunk's rows; params row i is verify row i's draw
  // (seed + i: row 0's seed is the first draft's). Writes I64 verdict [2, 1]: the drafts that stand,
  // then the token after them (kNanLogitsToken for NaN target logits) or, for drafts the rule
  // cannot judge, a speculative.h code (verdict_from turns it into judge_drafts's error; a backend
  // may throw that error at once instead).
  virtual void judge_drafts(const Tensor& target_logits, const DraftRows& drafts, const SamplingRows& params,
                            const Tensor& verdict) = 0;
  // What every backend's judge_drafts checks first: the shapes and dtypes above.
  static void check_judge_drafts(const Tensor& target_logits, const DraftRows& drafts, const SamplingRows& params,
                                 const Tensor& verdict);
};

}  // namespace g4
