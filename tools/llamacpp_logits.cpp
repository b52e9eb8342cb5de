// Golden logits from llama.cpp itself (built against its libllama; compiled by
// tools/gpu_llamacpp_golden.sh, never part of g4): evaluates comma-separated token ids in one batch
// from an empty cache on the CPU and writes every position's logits as float32 [position][vocab].
//   llamacpp_logits MODEL.gguf IDS_FILE OUT.f32
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf IDS_FILE OUT.f32\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  std::ifstream in(argv[2]);
  for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoi(item));
  if (ids.empty()) {
    std::fprintf(stderr, "no token ids in %s\n", argv[2]);
    return 2;
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;  // the CPU backend: the reference arithmetic
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cp.n_batch = cp.n_ubatch = uint32_t(ids.size());
  cp.n_threads = cp.n_threads_batch = 8;
  // float32 K/V and no flash attention: the logits of the file's weights in float32 arithmetic
  // (llama.cpp's default f16 cache alone moves them by ~5e-4 relative L2).
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  llama_batch batch = llama_batch_init(int32_t(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = llama_pos(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = int32_t(ids.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_decode failed\n");
    return 1;
  }
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::ofstream out(argv[3], std::ios::binary);
  for (size_t i = 0; i < ids.size(); ++i)
    out.write(reinterpret_cast<const char*>(llama_get_logits_ith(ctx, int32_t(i))), std::streamsize(vocab) * 4);
  std::printf("%zu positions x %d logits -> %s\n", ids.size(), vocab, argv[3]);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return out.good() ? 0 : 1;
}
