// Prefill attention: a chunk of T > 1 queries over the cached positions plus the chunk's own keys
// (causal, optionally a sliding window), then the chunk's K/V are stored in the ring or flat cache.
#include <algorithm>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

namespace {

// FlashAttention-2 on Hopper's warpgroup tensor cores (wgmma, bf16 inputs, float32 accumulation).
// The rows of a block are (query, head) pairs of one KV group, query-major (row R: query R / group,
// head kvh * group + R % group), so the group's heads share every K/V tile staged in shared memory.
// A block of two warpgroups walks the key tiles its rows can see; tiles are double-buffered with
// cp.async, the next one's copies issued right behind S's wgmma so that the tensor cores start
// first and the copies run under the current tile's work. A warpgroup owns 64 rows: S = Q·K^T
// comes back to its registers, the online softmax runs there, P is rounded to bf16 in place as the
// register A operand of P·V, and O stays in registers until the end. O of 64 x 512 floats would
// take 256 registers a thread, so for head dims past 256 the two warpgroups share 64 rows: each
// computes S over its half of the head dims, they add their halves through shared memory, and each
// accumulates its half of O's columns. Head dims below 512 that are not 64, 128 or 256 run in the
// next instantiation, zero-padded.
constexpr int kPrefillThreads = 256;  // two warpgroups
constexpr float kRescaleLog2 = 8.0f;  // see the online softmax

template <int DP>  // padded head dim: 64, 128, 256 or 512
struct PrefillTile {
  static constexpr int kSplit = DP > 256 ? 2 : 1;  // warpgroups sharing one 64-row slab
  static constexpr int kRowGroups = 2 / kSplit;
  static constexpr int kRows = 64 * kRowGroups;     // (query, head) rows of a block
  static constexpr int kKeys = DP > 256 ? 32 : 64;  // keys per tile (shared memory bound)
  static constexpr int kGroupDims = DP / kSplit;    // head dims of S's sum and of O per warpgroup
  static constexpr int kQBytes = kRows * DP * 2;
  static constexpr int kTileBytes = kKeys * DP * 2;  // one of K, V
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kExchangeBytes = kSplit == 2 ? kPrefillThreads * kKeys / 2 * 4 : 0;
  // + 1024: the swizzled tiles need 1024-byte alignment, dynamic shared memory guarantees less.
  static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStageBytes + kExchangeBytes;
};

struct PrefillArgs {
  AttentionLaunch a;
  int group;         // query heads per KV head
  int rows;          // T * group
  float scale_log2;  // scale * log2(e): the softmax runs in base 2
};

// Visits the 16-byte chunks of `Rows` rows of DP columns of a swizzled tile: thread i takes column
// chunk i % (DP / 8) of rows i / (DP / 8) + k * (threads / (DP / 8)); copy(j, col, offset) copies
// row j's chunk at col to byte `offset` of the tile.
template <int DP, int Rows, class CopyChunk>
__device__ inline void stage_rows(CopyChunk copy) {
  constexpr int kChunks = DP / 8, kRowsPerPass = kPrefillThreads / kChunks;
  static_assert(Rows % kRowsPerPass == 0, "a tile must be whole passes of the block");
  const int col = threadIdx.x % kChunks * 8;
#pragma unroll
  for (int i = 0; i < Rows / kRowsPerPass; ++i) {
    const int j = threadIdx.x / kChunks + i * kRowsPerPass;
    copy(j, col, swizzled_offset(Rows, j, col));
  }
}

__device__ inline void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int DP>
__global__ __launch_bounds__(kPrefillThreads, 1) void prefill_attention_kernel(PrefillArgs args) {
  using L = PrefillTile<DP>;
  constexpr int kKeys = L::kKeys, kNBlocks = kKeys / 8, kDChunks = L::kGroupDims / 64;
  extern __shared__ __align__(1024) uint8_t prefill_smem[];
  const uint32_t smem = (shared_addr(prefill_smem) + 1023) & ~1023u;
  uint8_t* const smem_ptr = prefill_smem + (smem - shared_addr(prefill_smem));
  const uint32_t q_smem = smem, kv_smem = smem + L::kQBytes;

  const AttentionLaunch& a = args.a;
  const int D = a.head_dim, G = args.group, kvh = blockIdx.x;
  // Broadcast so that the compiler sees a warp-uniform value: wgmma issued under conditions derived
  // from it needs no serialization.
  const int warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x >> 7), 0), row_group = warpgroup % L::kRowGroups;
  const int dim0 = warpgroup / L::kRowGroups * L::kGroupDims;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * L::kRows;  // the latest queries (most keys) start first
  const int pos0 = a.positions[0];
  // Query position of block row r; padding rows past the chunk repeat its last query.
  const int q_pos0 = pos0 + int(a.q_first);
  auto row_pos = [&](int r) { return q_pos0 + min(row0 + r, args.rows - 1) / G; };
  auto first_visible = [&](int p) { return int(first_key(p, a.window)); };
  const int key_begin = first_visible(row_pos(0)), key_end = row_pos(L::kRows - 1) + 1;

  stage_rows<DP, L::kRows>([&](int j, int col, uint32_t offset) {
    const int r = row0 + j;
    const bool valid = r < args.rows && col < D;
    const bf16* src = a.q + int64_t(r / G) * a.q_stride + int64_t(kvh * G + r % G) * D + col;
    cp_async16(q_smem + offset, valid ? src : a.q, valid);
  });
  // Keys [kb, kb + kKeys) into stage `stage`; zeros past key_end (they are masked, and zeros keep
  // P·V free of whatever an unwritten row holds).
  auto stage_keys_tile = [&](int kb, int stage) {
    const uint32_t k_dst = kv_smem + stage * L::kStageBytes, v_dst = k_dst + L::kTileBytes;
    if (kb >= pos0 && kb + kKeys <= key_end && D == DP) {
      // The common case, every key of the tile in the chunk and none padding: consecutive rows of
      // k_new / v_new, with a fraction of the general path's address arithmetic per copy.
      const int64_t first = int64_t(kb - pos0) * a.kv_stride + int64_t(kvh) * D;
      const bf16 *k_rows = a.k_new + first, *v_rows = a.v_new + first;
      stage_rows<DP, kKeys>([&](int j, int col, uint32_t offset) {
        const int64_t off = int64_t(j) * a.kv_stride + col;
        cp_async16(k_dst + offset, k_rows + off, true);
        cp_async16(v_dst + offset, v_rows + off, true);
      });
      return;
    }
    stage_rows<DP, kKeys>([&](int j, int col, uint32_t offset) {
      const int kp = kb + j;
      const bool valid = kp < key_end && col < D;
      const bool fresh = kp >= pos0;
      const int64_t row = fresh ? int64_t(kp - pos0) : valid ? cache_row(a, kp) : 0;
      const int64_t off = row * a.kv_stride + int64_t(kvh) * D + col;
      cp_async16(k_dst + offset, valid ? (fresh ? a.k_new : a.k_cache) + off : a.k_new, valid);
      cp_async16(v_dst + offset, valid ? (fresh ? a.v_new : a.v_cache) + off : a.v_new, valid);
    });
  };
  stage_keys_tile(key_begin, 0);
  cp_async_commit();

  // This thread's accumulator rows: g = lane / 4 and g + 8 of its warp's 16.
  const int group_row = row_group * 64, row_a = group_row + (threadIdx.x >> 5 & 3) * 16 + (threadIdx.x >> 2 & 7);
  const int lane_col = 2 * (threadIdx.x & 3);
  const int p_row[2] = {row_pos(row_a), row_pos(row_a + 8)};
  const int lo_row[2] = {first_visible(p_row[0]), first_visible(p_row[1])};
  const bool group_has_rows = row0 + group_row < args.rows;
  const int group_p_first = row_pos(group_row), group_p_last = row_pos(group_row + 63);
  // Keys some row of the warpgroup sees: [seen_begin, seen_end); keys all of them see: [all_begin, all_end).
  const int seen_begin = first_visible(group_p_first), seen_end = group_p_last + 1;
  const int all_begin = first_visible(group_p_last), all_end = group_p_first + 1;

  // Operand descriptors at this warpgroup's rows and first head dim; a 16-dim step moves 32 bytes
  // within a 64-dim block, a 16-key step 16 rows.
  const uint64_t q_desc = swizzled_desc(q_smem + dim0 / 64 * L::kRows * 128 + group_row * 128);
  auto dim_step = [](int rows, int ks) { return uint64_t((ks / 4 * rows * 128 + ks % 4 * 32) >> 4); };

  float o[kDChunks][8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's share of the row sum
  const int tiles = (key_end - key_begin + kKeys - 1) / kKeys;
  for (int tile = 0; tile < tiles; ++tile) {
    const int kb = key_begin + tile * kKeys;
    cp_async_wait_all_for_wgmma();
    __syncthreads();  // this tile is visible to all, and every warpgroup is done with the previous one
    const bool visible = group_has_rows && kb < seen_end && kb + kKeys > seen_begin;
    const uint32_t k_tile = kv_smem + (tile & 1) * L::kStageBytes + dim0 / 64 * kKeys * 128;
    const uint64_t k_desc = swizzled_desc(k_tile), v_desc = swizzled_desc(k_tile + L::kTileBytes);
    float s[kNBlocks][4];
    if (visible) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < L::kGroupDims / 16; ++ks)
        wgmma_ss<kKeys>(s, q_desc + dim_step(L::kRows, ks), k_desc + dim_step(kKeys, ks), ks > 0);
      wgmma_commit();
    }
    if (tile + 1 < tiles) stage_keys_tile(kb + kKeys, (tile + 1) & 1);
    cp_async_commit();
    wgmma_wait_all();  // on every path, so the compiler sees no wgmma outstanding at the loop's end
    if (!visible) continue;
    wgmma_pin(s);
    if constexpr (L::kSplit == 2) {  // add the partner's half of the head dims (same thread, same layout)
      float4* exchange = reinterpret_cast<float4*>(smem_ptr + L::kQBytes + 2 * L::kStageBytes);
      const int me = threadIdx.x & 127;
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
        exchange[(warpgroup * kNBlocks + nb) * 128 + me] = make_float4(s[nb][0], s[nb][1], s[nb][2], s[nb][3]);
      named_barrier(1 + row_group, 128 * L::kSplit);
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) {
        const float4 other = exchange[((warpgroup ^ 1) * kNBlocks + nb) * 128 + me];
        s[nb][0] += other.x, s[nb][1] += other.y, s[nb][2] += other.z, s[nb][3] += other.w;
      }
    }

    // Online softmax in base 2; element e of block nb is row e / 2, key kb + nb * 8 + 2 (lane % 4) + e % 2.
    if (kb < all_begin || kb + kKeys > all_end) {
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kp = kb + nb * 8 + lane_col + (e & 1);
          if (kp < lo_row[e >> 1] || kp > p_row[e >> 1]) s[nb][e] = -INFINITY;
        }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
      mx = xor_reduce<MaxOp, 1, 2>(mx);  // the 4 lanes that hold one row
      // FlashAttention-4's conditional rescaling: while the tile's max exceeds the running max by at
      // most 2^kRescaleLog2 in P, keep the running max: P stays below 256 (bf16 is as exact there),
      // alpha is exactly 1, and O skips its rescale, which most tiles past the first few then do.
      if (m[r] != -INFINITY && (mx - m[r]) * args.scale_log2 <= kRescaleLog2) mx = m[r];
      // exp2((s - max) * scale * log2 e) as one FMA (scale > 0); a row that has seen no key yet keeps P = 0.
      const float ref = mx == -INFINITY ? 0.0f : mx * args.scale_log2;
      alpha[r] = exp2_approx(m[r] * args.scale_log2 - ref);
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nb][e] = exp2_approx(fmaf(s[nb][e], args.scale_log2, -ref));
          sum += s[nb][e];
        }
      l[r] = l[r] * alpha[r] + sum;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int dc = 0; dc < kDChunks; ++dc)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          o[dc][i][0] *= alpha[0], o[dc][i][1] *= alpha[0];
          o[dc][i][2] *= alpha[1], o[dc][i][3] *= alpha[1];
        }
    }
    uint32_t p[kKeys / 16][4];  // P (bf16) as A fragments, 16 keys each
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
#pragma unroll
    for (int dc = 0; dc < kDChunks; ++dc) wgmma_pin(o[dc]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int dc = 0; dc < kDChunks; ++dc)
        wgmma_rs_n64(o[dc], p[kk], v_desc + uint64_t((dc * kKeys * 128 + kk * 16 * 128) >> 4));
    wgmma_commit();
    wgmma_wait_all();
#pragma unroll
    for (int dc = 0; dc < kDChunks; ++dc) wgmma_pin(o[dc]);
  }

  // O / l in bf16 over the warp's own rows and dims of the Q tile, then 16-byte stores.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum = xor_reduce<SumOp, 1, 2>(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // 0: a padding warpgroup that saw nothing
#pragma unroll
    for (int dc = 0; dc < kDChunks; ++dc)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        *reinterpret_cast<__nv_bfloat162*>(
            smem_ptr + swizzled_offset(L::kRows, row_a + 8 * r, dim0 + dc * 64 + i * 8 + lane_col)) =
            __floats2bfloat162_rn(o[dc][i][2 * r] * inv, o[dc][i][2 * r + 1] * inv);
  }
  __syncwarp();
  constexpr int kRowChunks = L::kGroupDims / 8;
  const int warp_row = group_row + (threadIdx.x >> 5 & 3) * 16;
  for (int i = threadIdx.x & 31; i < 16 * kRowChunks; i += 32) {
    const int rr = warp_row + i / kRowChunks, col = dim0 + i % kRowChunks * 8, r = row0 + rr;
    if (r < args.rows && col < D)
      *reinterpret_cast<uint4*>(a.out + int64_t(r / G) * a.out_stride + int64_t(kvh * G + r % G) * D + col) =
          *reinterpret_cast<const uint4*>(smem_ptr + swizzled_offset(L::kRows, rr, col));
  }
}

// Stores the chunk's K/V rows (the last `capacity` of them, which a ring holds) at their cache rows,
// 16 bytes at a time (rows hold kv_heads * head_dim values, a multiple of 16).
__global__ void store_kv_kernel(AttentionLaunch a) {
  const int64_t vecs = int64_t(a.kv_heads) * a.head_dim / 8, stride = a.kv_stride / 8;
  const int64_t first = max(int64_t(0), a.T - a.capacity()), pos0 = a.positions[0];
  const uint4 *k = reinterpret_cast<const uint4*>(a.k_new), *v = reinterpret_cast<const uint4*>(a.v_new);
  uint4 *k_cache = reinterpret_cast<uint4*>(a.k_cache), *v_cache = reinterpret_cast<uint4*>(a.v_cache);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (a.T - first) * vecs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = first + i / vecs, c = i % vecs, row = cache_row(a, int(pos0 + t));
    k_cache[row * stride + c] = k[t * stride + c];
    v_cache[row * stride + c] = v[t * stride + c];
  }
}

template <int DP>
void launch_prefill_tiles(const PrefillArgs& args, cudaStream_t stream) {
  using L = PrefillTile<DP>;
  const dim3 grid(unsigned(args.a.kv_heads), unsigned(ceil_div(args.rows, L::kRows)));
  launch_kernel("prefill_attention_kernel", prefill_attention_kernel<DP>, grid, kPrefillThreads, L::kSmemBytes, stream,
                Pdl::kOff, args);
}

}  // namespace

void launch_prefill_attention(const AttentionLaunch& a, cudaStream_t stream) {
  check_attention_shape(a);
  G4_CHECK(!a.norm_inputs, "prefill attention: q/k/v must be normed before (head_norms)");
  G4_CHECK(a.kv_stride % 8 == 0, "cuda attention: K/V rows must be 16-byte aligned");
  const int group = a.heads / a.kv_heads;
  G4_CHECK(a.scale > 0.0f, "cuda attention: the softmax scale must be positive");
  const PrefillArgs args{a, group, int(a.T - a.q_first) * group, a.scale * 1.4426950408889634f};
  if (args.rows > 0) {  // else no queries: only the K/V store
    if (a.head_dim <= 64)
      launch_prefill_tiles<64>(args, stream);
    else if (a.head_dim <= 128)
      launch_prefill_tiles<128>(args, stream);
    else if (a.head_dim <= 256)
      launch_prefill_tiles<256>(args, stream);
    else
      launch_prefill_tiles<512>(args, stream);
  }
  launch_store_kv(a, stream);
}

void launch_store_kv(const AttentionLaunch& a, cudaStream_t stream) {
  const int64_t vecs = std::min(a.T, a.capacity()) * a.kv_heads * a.head_dim / 8;
  launch_kernel("store_kv_kernel", store_kv_kernel, unsigned(std::min<int64_t>(ceil_div(vecs, 256), 4096)), 256, 0,
                stream, Pdl::kOff, a);
}

}  // namespace g4
