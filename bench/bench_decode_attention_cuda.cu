// Batch-1 decode attention at long contexts, alone: how fast the split kernel and its merge read a
// full-attention layer's keys and values for each KV cache type, against the copy bandwidth. The
// 31B's full layers (32 query heads over 4 KV heads of 512 dims) by default; the cache is paged as
// the pool pages it (a page holds the K rows, then the V rows, of `page` positions), filled with
// random rows (TQ4: random codes and a norm of 1; Q8_0: random quants, a scale of 1/64; bf16:
// random values in [-1, 1)). Prints per context the microseconds of one launch pair and the
// bytes of visible keys and values over that time. `page` 0: the pool's page of the 31B with bf16
// sliding caches, 256 KiB of K rows.
//   bench_decode_attention_cuda [types=bf16,q8_0,tq4] [contexts=4096,32768,131072,262144]
//                               [heads=32] [kv_heads=4] [head_dim=512] [page=0]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/copy_bandwidth.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/quantized_kv_kernels.h"
#include "cuda_timing.h"
#include "model/kv_types.h"
#include "util/dtype.h"
#include "util/half.h"

namespace {

using g4::bench::check;
constexpr int kSplits = 128;  // the CUDA backend's decode splits

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// The cache rows of a --kv_type name on the CUDA backend (bf16 activations).
g4::DType kv_row_type(const std::string& name) {
  return g4::kv_row_dtype(g4::parse_kv_type(name, false), g4::DType::BF16);
}

// One cache row of `dtype` holding kv_heads heads of head_dim random values.
std::vector<uint8_t> random_row(g4::DType dtype, int kv_heads, int head_dim, size_t bytes, std::mt19937& rng) {
  std::vector<uint8_t> row(bytes, 0);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  if (dtype == g4::DType::BF16) {
    for (size_t i = 0; i + 1 < bytes; i += 2) {
      const uint16_t b = g4::f32_to_bf16(value(rng));
      row[i] = uint8_t(b), row[i + 1] = uint8_t(b >> 8);
    }
  } else if (dtype == g4::DType::Q8_0) {
    for (size_t b = 0; b + 34 <= bytes; b += 34) {
      const uint16_t scale = g4::f32_to_f16(1.0f / 64);
      row[b] = uint8_t(scale), row[b + 1] = uint8_t(scale >> 8);
      for (int i = 0; i < 32; ++i) row[b + 2 + size_t(i)] = uint8_t(byte(rng));
    }
  } else {
    const size_t codes = size_t(kv_heads) * size_t(head_dim / 2);
    for (size_t i = 0; i < codes; ++i) row[i] = uint8_t(byte(rng));
    const uint16_t norm = g4::f32_to_bf16(1.0f);
    for (int h = 0; h < kv_heads; ++h) row[codes + 2 * size_t(h)] = uint8_t(norm), row[codes + 2 * size_t(h) + 1] = uint8_t(norm >> 8);
  }
  return row;
}

void run(g4::DType dtype, int64_t context, int heads, int kv_heads, int head_dim, int page, double copy_gbps) {
  const size_t row = g4::row_bytes(dtype, g4::kv_cache_cols(dtype, kv_heads, head_dim));
  if (page == 0) page = int(std::max<size_t>(1, (size_t(256) << 10) / row));
  const int64_t pages = (context + page - 1) / page;
  // The pages in a shuffled order, as a pool that has served other sequences hands them out.
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) table[size_t(i)] = int32_t(i);
  std::mt19937 rng(7);
  std::shuffle(table.begin(), table.end(), rng);
  const size_t page_bytes = 2 * size_t(page) * row;
  g4::DeviceBuffer cache(size_t(pages) * page_bytes), table_d(table.size() * 4);
  check(cudaMemcpy(table_d.data(), table.data(), table.size() * 4, cudaMemcpyHostToDevice), "upload table");
  // A few distinct random rows repeated over the cache: the kernels' speed does not depend on which.
  std::vector<uint8_t> block;
  for (int r = 0; r < 61; ++r) {
    const std::vector<uint8_t> one = random_row(dtype, kv_heads, head_dim, row, rng);
    block.insert(block.end(), one.begin(), one.end());
  }
  for (size_t at = 0; at < size_t(pages) * page_bytes; at += block.size())
    check(cudaMemcpy(cache.as<uint8_t>() + at, block.data(), std::min(block.size(), size_t(pages) * page_bytes - at),
                     cudaMemcpyHostToDevice),
          "fill cache");

  const int64_t q_values = int64_t(heads) * head_dim, kv_values = int64_t(kv_heads) * head_dim;
  std::vector<uint16_t> host(static_cast<size_t>(q_values));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (uint16_t& v : host) v = g4::f32_to_bf16(value(rng));
  g4::DeviceBuffer q(size_t(q_values) * 2), kv_new(size_t(kv_values) * 2), out(size_t(q_values) * 2), position(4);
  check(cudaMemcpy(q.data(), host.data(), host.size() * 2, cudaMemcpyHostToDevice), "upload q");
  check(cudaMemcpy(kv_new.data(), host.data(), size_t(kv_values) * 2, cudaMemcpyHostToDevice), "upload k");
  const int32_t last = int32_t(context - 1);
  check(cudaMemcpy(position.data(), &last, 4, cudaMemcpyHostToDevice), "upload position");

  g4::AttentionLaunch a{};
  a.q = q.as<g4::bf16>(), a.k_new = kv_new.as<g4::bf16>(), a.v_new = kv_new.as<g4::bf16>();
  a.out = out.as<g4::bf16>();
  a.positions = position.as<int32_t>();
  a.T = 1;
  a.page_table = table_d.as<int32_t>();
  a.table_slots = int(pages), a.page_positions = page, a.page_stride = 2 * page;
  a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim, a.window = 0;
  a.scale = 1.0f;
  a.q_stride = q_values, a.kv_stride = kv_values, a.out_stride = q_values;
  uint8_t* k_rows = cache.as<uint8_t>();
  uint8_t* v_rows = k_rows + size_t(page) * row;
  g4::DeviceBuffer partials(size_t(g4::decode_partial_floats(a, kSplits)) * 4);
  float* partial_floats = partials.as<float>();
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");
  std::function<void()> launch;
  if (dtype == g4::DType::BF16) {
    a.k_cache = reinterpret_cast<g4::bf16*>(k_rows), a.v_cache = reinterpret_cast<g4::bf16*>(v_rows);
    g4::DecodeCaches caches;
    caches.k[0] = a.k_cache, caches.v[0] = a.v_cache, caches.table[0] = a.page_table;
    launch = [=] { g4::launch_decode_attention(a, caches, partial_floats, kSplits, nullptr, stream); };
  } else {
    g4::QuantizedKvLaunch ql;
    ql.a = a, ql.dtype = dtype, ql.row_bytes = int64_t(row);
    ql.caches.k[0] = k_rows, ql.caches.v[0] = v_rows, ql.caches.table[0] = a.page_table;
    launch = [=] { g4::launch_quantized_decode_attention(ql, partial_floats, kSplits, stream); };
  }
  const double ms = g4::bench::ms_per_launch([&](int) { launch(); }, 20, 200, stream);
  // Bytes of the keys and values read: each head's part of K and V rows (TQ4: codes and norm).
  const size_t head_bytes = dtype == g4::DType::TQ4 ? size_t(head_dim / 2 + 2) : row / size_t(kv_heads);
  const double bytes = 2.0 * double(context) * double(kv_heads) * double(head_bytes);
  std::printf("{\"kv_type\": \"%s\", \"context\": %lld, \"us\": %.2f, \"kv_bytes\": %.0f, \"gb_per_s\": %.1f, "
              "\"pct_of_copy\": %.1f}\n",
              g4::dtype_name(dtype).c_str(), static_cast<long long>(context), ms * 1e3, bytes, bytes / ms / 1e6,
              100.0 * bytes / ms / 1e6 / copy_gbps);
  check(cudaStreamDestroy(stream), "stream");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> types = split_list(argc > 1 ? argv[1] : "bf16,q8_0,tq4");
    const std::vector<std::string> contexts = split_list(argc > 2 ? argv[2] : "4096,32768,131072,262144");
    const int heads = argc > 3 ? std::atoi(argv[3]) : 32, kv_heads = argc > 4 ? std::atoi(argv[4]) : 4;
    const int head_dim = argc > 5 ? std::atoi(argv[5]) : 512, page = argc > 6 ? std::atoi(argv[6]) : 0;
    if (heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 16 || page < 0)
      throw std::runtime_error("heads, kv_heads, head_dim must be positive, page at least 0, heads a multiple of kv_heads");
    g4::upload_tq4_tables();
    const double copy_gbps = g4::measure_copy_bandwidth(size_t(1) << 30) / 1e9;
    std::printf("{\"copy_gb_per_s\": %.1f}\n", copy_gbps);
    for (const std::string& t : types)
      for (const std::string& c : contexts) run(kv_row_type(t), std::stoll(c), heads, kv_heads, head_dim, page, copy_gbps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_attention_cuda: %s\n", e.what());
    return 1;
  }
}
