// g4 bench: prefill time, decode tok/s (greedy and top_k+top_p, plain and CUDA-graph), achieved
// weight bandwidth against the device's measured copy bandwidth, and the sampling share of a step,
// on a real model (--model_path) or a synthetic one of the exact 31B shape generated on the GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "bench_concurrency.h"
#include "bench_held.h"
#include "cli_util.h"
#include "commands.h"
#include "grammar/json_schema.h"
#include "model/loader.h"
#include "model/synthetic_weights.h"
#include "quant/quantize.h"
#include "runtime/decode_graph.h"
#include "runtime/generator.h"
#include "runtime/session.h"
#include "runtime/tensor_parallel.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/files.h"
#include "util/error.h"
#ifdef G4_HAVE_CUDA
#include "backend/cuda/copy_bandwidth.h"
#endif

namespace g4::cli {

namespace {

struct BenchOptions {
  std::string synthetic, model_path, weights = "bf16", backend = "cuda";
  int64_t prompt_len = 2048, gen = 128;
  uint64_t seed = 1;
  std::vector<int64_t> concurrency;  // non-empty: the continuous-batching bench instead
  std::vector<int64_t> held;           // non-empty: the held-sequences bench (bench_held) instead
  bool batch_invariant = true;        // the continuous-batching bench's SchedulerOptions::batch_invariant
  bool cuda_graph = false;            // the continuous-batching bench's SchedulerOptions::cuda_graphs
  int64_t profile_steps = 0;          // the continuous-batching bench's ConcurrencyBench::profile_steps
  bool suite = false;                 // llama-bench's table in one load (suite_report)
  std::vector<int64_t> suite_prompts{512, 2048}, suite_contexts{1024, 32768};
  int tp = 1;                         // > 1: the model split over tp ranks (bench_tensor_parallel)
  std::string tp_all_reduce = "peer";  // how CUDA ranks sum: "peer" (peer memory when reachable) or "nccl"
  std::string json_schema;             // the continuous-batching bench's sequences constrained by this schema file
  KvTypeFlags kv;                      // the KV caches' types
  std::string draft_model;             // an MTP assistant ("synthetic": the 31B's): the single run also decodes in rounds
  int64_t draft_tokens = 0;            // 0: the assistant's num_assistant_tokens, else 4
  double draft_accept = -1;            // >= 0: the drafts that stand a round, forced (ForcedAcceptance)
  bool bf16_weight_copies = false;     // EngineOptions::bf16_weight_copies
};

// With `comm`, that rank's shard (docs/DESIGN.md, "Tensor parallel").
std::unique_ptr<Gemma4> synthetic_model(const BenchOptions& o, Backend& backend, Communicator* comm = nullptr) {
  G4_CHECK(o.synthetic == "31b", "--synthetic: only '31b' is known");
  G4_CHECK(backend.name() == "cuda", "--synthetic 31b needs --backend cuda (17-61 GB of weights generated on the GPU)");
  ModelConfig c = gemma4_31b_config();
  if (!comm) return std::make_unique<Gemma4>(c, synthetic_weights(c, backend, o.seed, o.weights));
  ModelWeights shard = synthetic_weights(c, backend, o.seed, o.weights, TpShard{comm->rank(), comm->size()});
  return std::make_unique<Gemma4>(std::move(c), std::move(shard), *comm);
}

// The model a bench runs and the KV caches it runs with: --kv_type and --kv_sliding_type over the
// file's defaults (bf16 for a synthetic model).
struct BenchModel {
  std::unique_ptr<Gemma4> model;
  KvTypes kv_types;
};
BenchModel bench_model(const BenchOptions& o, Backend& backend, Communicator* comm = nullptr) {
  if (!o.synthetic.empty()) return {synthetic_model(o, backend, comm), o.kv.choice().over({})};
  LoadedProgram loaded = load_program(o.model_path, backend, comm);
  return {std::move(loaded.model), o.kv.choice().over(loaded.program.kv_types)};
}

// Bytes of weights one decode step streams: every layer matrix and the LM head.
double weight_bytes_per_step(const Gemma4& model) {
  double bytes = double(model.weights().lm_head.bytes());
  for (const LayerWeights& l : model.weights().layers)
    for (const Tensor* t : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      bytes += double(t->bytes());
  return bytes;
}

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Weight bandwidth (bytes/s) of the decode matmul alone: one token through `w`, back to back.
double gemv_bandwidth(Backend& be, const Tensor& w) {
  Tensor x = be.alloc(be.activation_dtype(), 1, w.cols), y = be.alloc(be.activation_dtype(), 1, w.rows);
  be.matmul(x, w, y);
  be.synchronize();
  const int reps = 20;
  return double(w.bytes()) * reps / seconds_of([&] {
    for (int i = 0; i < reps; ++i) be.matmul(x, w, y);
    be.synchronize();
  });
}

// [rows, cols] activations uniform in [-1, 1]: zeros would let the tensor cores draw less power and
// run faster than a real prompt does.
Tensor random_activations(Backend& be, int64_t rows, int64_t cols, uint64_t seed) {
  const DType a = be.activation_dtype();
  Tensor t = be.alloc(a, rows, cols);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> bytes(t.bytes());
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    encode_row(a, row.data(), cols, bytes.data() + size_t(r) * t.row_size());
  }
  be.upload(bytes.data(), t);
  return t;
}

// Seconds of the prefill matmuls alone: every layer's seven matrices over a T-token chunk of random
// activations.
double prefill_matmul_seconds(Backend& be, const Gemma4& model, int64_t T) {
  const DType a = be.activation_dtype();
  int64_t widest = 0;
  for (const LayerWeights& l : model.weights().layers)
    for (const Tensor* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      widest = std::max({widest, w->rows, w->cols});
  const Tensor x = random_activations(be, T, widest, 7), y = be.alloc(a, T, widest);
  auto prefix = [&](Tensor t, int64_t cols) {  // the first T * cols values as [T, cols]
    t.rows = T;
    t.cols = cols;
    return t;
  };
  auto all_matmuls = [&] {
    for (const LayerWeights& l : model.weights().layers)
      for (const Tensor* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
        if (!w->empty()) be.matmul(prefix(x, w->cols), *w, prefix(y, w->rows));
    be.synchronize();
  };
  all_matmuls();
  return seconds_of(all_matmuls);
}

// Seconds of one layer's attention over a T-token chunk at position 0 (inputs are zeros: the work
// does not depend on the values).
double attention_seconds(Backend& be, const ModelConfig& c, const LayerConfig& l, int64_t T) {
  const DType a = be.activation_dtype();
  const int64_t q_cols = int64_t(c.num_heads) * l.head_dim, kv_cols = int64_t(l.kv_heads) * l.head_dim;
  // A sliding layer's ring holds two windows, whatever the chunk (a 512-token prompt still has one).
  const int64_t capacity = l.sliding ? std::max<int64_t>(T, 2 * int64_t(c.sliding_window)) : T;
  const KvCache cache = one_page_kv_cache(be, a, capacity, kv_cols);
  AttentionArgs args;
  args.q = be.alloc(a, T, q_cols);
  args.k_new = be.alloc(a, T, kv_cols);
  args.v_new = be.alloc(a, T, kv_cols);
  args.out = be.alloc(a, T, q_cols);
  args.cache = &cache;
  args.positions = be.alloc(DType::I32, T, 1);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(i);
  be.upload(pos.data(), args.positions);
  args.heads = c.num_heads;
  args.kv_heads = l.kv_heads;
  args.head_dim = l.head_dim;
  args.window = l.sliding ? c.sliding_window : 0;
  be.attention(args);
  be.synchronize();
  return seconds_of([&] {
    be.attention(args);
    be.synchronize();
  });
}

struct DecodeResult {
  double tok_s = 0, step_ms = 0;
};

// Prefill, the first token, then `gen` more tokens by plain decode or by graph replay.
DecodeResult time_decode(Session& s, Backend& be, std::span<const int32_t> prompt, const Sampler& sampler, int64_t gen,
                         bool graph) {
  s.reset();
  s.prefill(prompt);
  int64_t token = s.sample(sampler, 0);
  be.synchronize();
  double secs = 0;
  if (graph) {
    DecodeGraph g(s);
    g.start(int32_t(token), sampler, 1);
    g.next();  // the first replay uploads the graph
    secs = seconds_of([&] {
      for (int64_t i = 1; i < gen; ++i) g.next();
    });
  } else {
    secs = seconds_of([&] {
      for (int64_t i = 1; i < gen; ++i) {
        s.decode(int32_t(token));
        token = s.sample(sampler, i);
      }
    });
  }
  return {double(gen - 1) / secs, secs / double(gen - 1) * 1e3};
}

// The assistant of o.draft_model: a file, the embedded demo assistant, or with --synthetic 31b the
// 31B assistant's shape with random weights of --weights' type.
std::unique_ptr<Gemma4Assistant> bench_assistant(const BenchOptions& o, const Gemma4& model, Backend& be) {
  if (o.draft_model == kDemoDraftModel) return load_assistant(demo_assistant(), be, model.config());
  if (o.draft_model != "synthetic") return load_assistant(o.draft_model, be, model.config());
  ModelConfig c = gemma4_31b_assistant_config();
  ModelWeights w = synthetic_weights(c, be, o.seed + 1, o.weights);
  return std::make_unique<Gemma4Assistant>(std::move(c), std::move(w), model.config());
}

// Decode of --gen tokens after `prompt` in draft-and-verify rounds with the assistant at
// o.draft_model (runtime/speculation.h), greedy and with `sampled`: tokens a second and where the
// rounds' time goes. With --draft_accept, the greedy rounds keep that many drafts of the target's
// own greedy text on average.
nlohmann::json drafted_decode_report(const BenchOptions& o, const Gemma4& model, Backend& be, Session& s,
                                     const std::vector<int32_t>& prompt, const SamplingParams& sampled) {
  const std::unique_ptr<Gemma4Assistant> assistant = bench_assistant(o, model, be);
  const int64_t k = o.draft_tokens > 0 ? o.draft_tokens : assistant->default_draft_tokens();
  char accept[32];
  std::snprintf(accept, sizeof accept, "%g", o.draft_accept);
  G4_CHECK(o.draft_accept <= double(k), std::string("--draft_accept ") + accept + " exceeds the " + std::to_string(k) +
                                            " drafts a round");
  GenerationRequest request;
  request.prompt = prompt;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  request.sampler = Sampler(greedy);
  request.max_new_tokens = o.gen;
  request.stop_ids = {};
  ForcedAcceptance forced;
  if (o.draft_accept >= 0) {
    s.reset();
    forced = ForcedAcceptance{generate(s, request).tokens, o.draft_accept};
  }
  request.draft = DraftOptions{assistant.get(), k, o.draft_accept >= 0 ? &forced : nullptr};
  s.reset();
  const GenerationResult g = generate(s, request);
  const SpeculationStats& stats = *s.speculation_stats();
  nlohmann::json r = {{"draft_model", o.draft_model},
                      {"draft_tokens", k},
                      {"drafted_decode_greedy_tok_s", double(g.tokens.size() - 1) / g.decode_seconds},
                      {"draft_rounds", stats.rounds},
                      {"draft_acceptance", stats.acceptance()},
                      {"draft_tokens_per_round", stats.tokens_per_round()},
                      {"draft_s", stats.draft_seconds},
                      {"verify_s", stats.verify_seconds},
                      {"draft_step_ms", stats.draft_step_ms()},
                      {"verify_ms", stats.verify_ms()}};
  if (o.draft_accept >= 0) r["draft_accept"] = o.draft_accept;
  if (be.records_steps()) {  // the same rounds with the draft steps replayed (Drafter::replay_steps)
    const SpeculationStats eager_rounds = *s.speculation_stats();
    request.graph = true;
    s.reset();
    const GenerationResult replayed = generate(s, request);
    const SpeculationStats rounds = s.speculation_stats()->since(eager_rounds);
    request.graph = false;
    r["drafted_decode_greedy_graph_tok_s"] = double(replayed.tokens.size() - 1) / replayed.decode_seconds;
    r["draft_step_graph_ms"] = rounds.draft_step_ms();
    r["verify_graph_ms"] = rounds.verify_ms();
  }
  // Sampled rounds: the verdict's acceptance rule runs on the backend (Backend::judge_drafts). The
  // session's counts hold every generation's rounds: this run's are those after the greedy ones.
  request.sampler = Sampler(sampled);
  request.draft.forced = nullptr;
  const SpeculationStats greedy_rounds = *s.speculation_stats();
  s.reset();
  const GenerationResult g_sampled = generate(s, request);
  const SpeculationStats sampled_rounds = s.speculation_stats()->since(greedy_rounds);
  r["drafted_decode_topk_topp_tok_s"] = double(g_sampled.tokens.size() - 1) / g_sampled.decode_seconds;
  r["draft_rounds_topk_topp"] = sampled_rounds.rounds;
  r["draft_tokens_per_round_topk_topp"] = sampled_rounds.tokens_per_round();
  r["verify_topk_topp_ms"] = sampled_rounds.verify_ms();
  r["draft_step_topk_topp_ms"] = sampled_rounds.draft_step_ms();
  return r;
}

// A context for a short run: at least the sliding window.
int64_t bench_max_seq_len(const ModelConfig& c, const BenchOptions& o) {
  return std::max(min_max_seq_len(c), std::min(c.max_position_embeddings, o.prompt_len + o.gen + 8));
}

std::vector<int32_t> random_prompt(const ModelConfig& c, uint64_t seed, int64_t tokens) {
  std::mt19937 rng{unsigned(seed)};
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (int32_t& id : prompt) id = int32_t(rng() % uint32_t(c.vocab_size));
  return prompt;
}

// Seconds of 3 prefills of `prompt` after a warm-up, fastest first.
std::vector<double> prefill_runs(Session& s, Backend& be, std::span<const int32_t> prompt) {
  std::vector<double> runs;
  for (int i = 0; i < 4; ++i) {  // the first run warms up cuBLAS and the caches
    s.reset();
    const double t = seconds_of([&] {
      s.prefill(prompt);
      be.synchronize();
    });
    if (i > 0) runs.push_back(t);
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

// Seconds of one decode step's collectives alone, back to back: an all-reduce of one hidden row
// after each layer's o_proj and down_proj, and the gather of the LM head's vocabulary shards. On a
// backend with graphs they run as the graph decode runs them: recorded once, replayed.
double step_collective_seconds(Backend& be, Communicator& comm, const Gemma4& model) {
  const ModelConfig& c = model.config();
  const Tensor row = be.alloc(be.activation_dtype(), 1, c.hidden_size);
  const Tensor shard = be.alloc(be.activation_dtype(), 1, c.vocab_size / comm.size());
  const Tensor whole = be.alloc(be.activation_dtype(), 1, c.vocab_size);
  auto step = [&] {
    for (int i = 0; i < 2 * c.num_layers(); ++i) comm.all_reduce_sum(row);
    comm.all_gather_cols(shard, whole);
  };
  step();
  comm.barrier();
  std::unique_ptr<Backend::RecordedStep> recorded;
  if (be.records_steps()) {
    be.begin_capture();
    step();
    be.end_capture(recorded);
    be.replay(*recorded);
    comm.barrier();
  }
  const int kSteps = 20;
  return seconds_of([&] {
    for (int i = 0; i < kSteps; ++i) recorded ? be.replay(*recorded) : step();
    comm.barrier();
  }) / kSteps;
}

// --json_schema: the schema compiled against the model file's tokenizer, ending on Gemma 4's stop
// tokens and the file's end-of-sequence ids.
std::shared_ptr<const grammar::CompiledGrammar> bench_grammar(const BenchOptions& o, const ModelConfig& c) {
  if (o.json_schema.empty()) return nullptr;
  G4_CHECK(!o.model_path.empty() && !o.concurrency.empty(), "--json_schema needs --model_path and --concurrency");
  const std::optional<std::string> tokenizer_json = model_tokenizer_json(o.model_path);
  G4_REQUIRE(kNotFound, tokenizer_json.has_value(), "--json_schema: " + o.model_path + " holds no tokenizer");
  const Tokenizer tokenizer = Tokenizer::from_json(*tokenizer_json);
  std::vector<int32_t> stops(kGemma4StopTokenIds.begin(), kGemma4StopTokenIds.end());
  for (int id : c.eos_ids) stops.push_back(id);
  std::erase_if(stops, [&](int32_t id) { return id >= tokenizer.vocab_size() || id >= c.vocab_size; });
  auto vocabulary = std::make_shared<const grammar::TokenVocabulary>(tokenizer, stops, int32_t(c.vocab_size));
  return std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(read_file(o.json_schema)),
                                                          vocabulary);
}

// The continuous-batching bench's report (bench_concurrency) on `model`.
nlohmann::json concurrency_report(const BenchOptions& o, const Gemma4& model, KvTypes kv_types, Backend& be,
                                  double load_s) {
  const std::unique_ptr<Gemma4Assistant> assistant = o.draft_model.empty() ? nullptr : bench_assistant(o, model, be);
  const int64_t k = !assistant ? 0 : o.draft_tokens > 0 ? o.draft_tokens : assistant->default_draft_tokens();
  nlohmann::json r = bench_concurrency(model, be,
                                       {o.concurrency, o.prompt_len, o.gen, o.seed, o.batch_invariant, o.cuda_graph,
                                        kv_types, o.profile_steps, bench_grammar(o, model.config()),
                                        DraftOptions{assistant.get(), k}});
  if (assistant) r["draft_model"] = o.draft_model, r["draft_tokens"] = k;
  r["model"] = o.synthetic.empty() ? o.model_path : "synthetic-" + o.synthetic;
  r["weights"] = o.synthetic.empty() ? "the file's" : o.weights;
  r["load_s"] = load_s;
  r["bf16_weight_copies"] = o.bf16_weight_copies;
  return r;
}

// One rank of `g4 bench --tp N`: every rank runs the same prefill and decode steps on its shard;
// rank 0 reports eager decode, and graph decode on CUDA. The collectives' share is of the graph
// step where there is one (of the eager step on the CPU). With --concurrency,
// every rank runs the same requests through its own scheduler: the scheduler is deterministic,
// so the ranks' forwards (and their collectives) stay in step (docs/DESIGN.md §9).
void bench_rank(const BenchOptions& o, CommGroup& group, int rank) {
  EngineOptions eo;
  eo.backend = o.backend;
  eo.bf16_weight_copies = o.bf16_weight_copies;
  eo.tp = group.size();
  eo.tp_group = &group;
  eo.tp_rank = rank;
  auto backend = make_engine_backend(eo);
  Backend& be = *backend;
  const std::unique_ptr<Communicator> comm = group.join(rank, be);
  run_or_abort([&](const std::string& what) { comm->abort(what); }, [&] {
    BenchModel bench;
    const double load_s = seconds_of([&] {
      bench = bench_model(o, be, comm.get());
      comm->barrier();
    });
    const std::unique_ptr<Gemma4>& model = bench.model;
    if (!o.concurrency.empty()) {
      nlohmann::json r = concurrency_report(o, *model, bench.kv_types, be, load_s);
      r["tp"] = comm->size();
      if (rank == 0) std::printf("%s\n", r.dump(1).c_str());
      return;
    }
    const ModelConfig& c = model->config();
    SessionOptions so;
    so.max_seq_len = bench_max_seq_len(c, o);
    so.kv_types = bench.kv_types;
    Session s(*model, be, so);
    const std::vector<int32_t> prompt = random_prompt(c, o.seed, o.prompt_len);
    const double prefill_s = prefill_runs(s, be, prompt)[1];  // the median of 3
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    const DecodeResult decode = time_decode(s, be, prompt, Sampler(greedy), o.gen, false);
    const bool graphs = be.records_steps();
    const DecodeResult graph = graphs ? time_decode(s, be, prompt, Sampler(greedy), o.gen, true) : decode;
    const double collectives_s = step_collective_seconds(be, *comm, *model);
    if (rank != 0) return;
    nlohmann::json r = {
        {"model", o.synthetic.empty() ? o.model_path : "synthetic-" + o.synthetic},
        {"backend", be.name()},
        {"tp", comm->size()},
        {"weights", o.synthetic.empty() ? "the file's" : o.weights},
        {"rank0_weight_bytes", describe_weight_bytes(weight_bytes_by_type(model->weights()))},
        {"load_s", load_s},
        {"prompt_len", o.prompt_len},
        {"prefill_s_median", prefill_s},
        {"prefill_tok_s", double(o.prompt_len) / prefill_s},
        {"gen", o.gen},
        {"decode_greedy_tok_s", decode.tok_s},
        {"step_ms_greedy", decode.step_ms},
        {"collectives_ms_per_step", collectives_s * 1e3},
        {"all_reduce_pct_of_step", 100.0 * collectives_s / (graph.step_ms * 1e-3)},
    };
    if (graphs) {
      r["decode_greedy_graph_tok_s"] = graph.tok_s;
      r["step_ms_greedy_graph"] = graph.step_ms;
    }
    r["all_reduce_path"] = comm->all_reduce_path();
    std::printf("%s\n", r.dump(1).c_str());
  });
}

// g4 bench --tp N (docs/DESIGN.md, "Tensor parallel"): one thread per rank, as g4 run.
void bench_tensor_parallel(const BenchOptions& o) {
  EngineOptions eo;
  eo.backend = o.backend;
  eo.tp = o.tp;
  eo.tp_all_reduce = o.tp_all_reduce == "nccl" ? CudaAllReduce::kNccl : CudaAllReduce::kPeerWhenReachable;
  const std::unique_ptr<CommGroup> group = make_comm_group(eo);  // checks the GPUs and NCCL first
  run_rank_threads(*group, [&](int rank) { bench_rank(o, *group, rank); });
}

// Bytes of the weights by storage type, as {"Q4_0": bytes, ...}.
nlohmann::json weight_bytes_json(const ModelWeights& weights) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [type, bytes] : weight_bytes_by_type(weights)) j[dtype_name(type)] = bytes;
  return j;
}

// g4 bench --suite: the decode and prefill targets' table from one load, as llama-bench's pp/tg rows: prompt processing
// (median of 3 prefills) at each of suite_prompts tokens, and greedy decode (graph replay on CUDA)
// after each of suite_contexts tokens of context, with the weight bandwidth of the first. Lengths
// beyond the model's context are cut to it; the report keys are the lengths run.
nlohmann::json suite_report(const BenchOptions& o, const Gemma4& model, KvTypes kv_types, Backend& be,
                            double copy_bytes_per_s) {
  const ModelConfig& c = model.config();
  G4_CHECK(!o.suite_prompts.empty() && !o.suite_contexts.empty(), "--suite needs prompt and context lengths");
  const int64_t room = c.max_position_embeddings - o.gen - 8;  // positions left for a prompt
  G4_CHECK(room >= 1, "--gen " + std::to_string(o.gen) + " leaves no room for a prompt in the model's context");
  auto cut = [&](int64_t n) {
    G4_CHECK(n >= 1, "--suite lengths must be >= 1, got " + std::to_string(n));
    return std::min(n, room);
  };
  int64_t longest = 0;
  for (int64_t n : o.suite_prompts) longest = std::max(longest, cut(n));
  for (int64_t n : o.suite_contexts) longest = std::max(longest, cut(n));
  SessionOptions so;
  so.max_seq_len = std::max(min_max_seq_len(c), std::min(c.max_position_embeddings, longest + o.gen + 8));
  so.kv_types = kv_types;
  Session s(model, be, so);
  nlohmann::json prefill = nlohmann::json::object(), decode = nlohmann::json::object();
  for (int64_t n : o.suite_prompts) {
    const std::vector<double> runs = prefill_runs(s, be, random_prompt(c, o.seed, cut(n)));
    prefill[std::to_string(cut(n))] = double(cut(n)) / runs[runs.size() / 2];
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  double first_step_ms = 0;
  for (int64_t n : o.suite_contexts) {
    const DecodeResult r =
        time_decode(s, be, random_prompt(c, o.seed, cut(n)), Sampler(greedy), o.gen, be.name() == "cuda");
    decode[std::to_string(cut(n))] = r.tok_s;
    if (first_step_ms == 0) first_step_ms = r.step_ms;
  }
  const double achieved = weight_bytes_per_step(model) / (first_step_ms * 1e-3);
  nlohmann::json r = kv_cache_json(s.runner().kv_pool());
  r.update(nlohmann::json{{"model", o.synthetic.empty() ? o.model_path : "synthetic-" + o.synthetic},
          {"backend", be.name()},
          {"weights", o.synthetic.empty() ? "the file's" : o.weights},
          {"weight_bytes_by_type", weight_bytes_json(model.weights())},
          {"gen", o.gen},
          {"prefill_tok_s", prefill},
          {"decode_greedy_tok_s", decode},
          {"achieved_tb_s", achieved / 1e12},
          {"copy_tb_s", copy_bytes_per_s / 1e12},
          {"achieved_pct_of_copy", copy_bytes_per_s > 0 ? 100.0 * achieved / copy_bytes_per_s : 0.0}});
  return r;
}

void run_bench(const BenchOptions& o) {
  G4_CHECK(o.synthetic.empty() != o.model_path.empty(), "give exactly one of --synthetic or --model_path");
  G4_CHECK(o.prompt_len >= 1 && o.gen >= 2, "--prompt_len must be >= 1 and --gen >= 2");
  G4_CHECK(o.draft_model.empty() || (!o.suite && o.tp == 1), "--draft_model runs with no --suite and no --tp");
  G4_CHECK(o.draft_model.empty() || (o.draft_model == "synthetic") == !o.synthetic.empty(),
           "--draft_model synthetic goes with --synthetic 31b (the 31B assistant's shape), a file or demo with --model_path");
  G4_CHECK(o.draft_accept < 0 || (!o.draft_model.empty() && o.concurrency.empty()),
           "--draft_accept needs --draft_model and one sequence");
  check_draft_tokens(o.draft_tokens);
  G4_CHECK(o.held.empty() || (o.concurrency.empty() && !o.suite && o.tp == 1 && o.draft_model.empty()),
           "--held runs alone: no --concurrency, --suite, --tp or --draft_model");
  o.kv.choice();  // a bad type fails before anything loads
  if (o.tp != 1) return bench_tensor_parallel(o);
  EngineOptions eo;
  eo.backend = o.backend;
  eo.bf16_weight_copies = o.bf16_weight_copies;
  auto backend = make_engine_backend(eo);
  Backend& be = *backend;
  double copy_bytes_per_s = 0;
#ifdef G4_HAVE_CUDA
  if (be.name() == "cuda") copy_bytes_per_s = measure_copy_bandwidth(size_t(2) << 30);
#endif
  BenchModel bench;
  const double load_s = seconds_of([&] { bench = bench_model(o, be); });
  const std::unique_ptr<Gemma4>& model = bench.model;
  const ModelConfig& c = model->config();
  if (!o.concurrency.empty()) {
    std::printf("%s\n", concurrency_report(o, *model, bench.kv_types, be, load_s).dump(1).c_str());
    return;
  }
  if (!o.held.empty()) {
    nlohmann::json r = bench_held(*model, be, {o.held, random_prompt(c, o.seed, o.prompt_len), o.gen, bench.kv_types});
    r["model"] = o.synthetic.empty() ? o.model_path : "synthetic-" + o.synthetic;
    r["weights"] = o.synthetic.empty() ? "the file's" : o.weights;
    r["load_s"] = load_s;
    std::printf("%s\n", r.dump(1).c_str());
    return;
  }
  if (o.suite) {
    nlohmann::json r = suite_report(o, *model, bench.kv_types, be, copy_bytes_per_s);
    r["load_s"] = load_s;
    std::printf("%s\n", r.dump(1).c_str());
    return;
  }

  SessionOptions so;
  so.max_seq_len = bench_max_seq_len(c, o);
  so.kv_types = bench.kv_types;
  Session s(*model, be, so);
  const std::vector<int32_t> prompt = random_prompt(c, o.seed, o.prompt_len);
  const std::vector<double> prefill_s = prefill_runs(s, be, prompt);

  SamplingParams greedy, topk_topp;
  greedy.temperature = 0.0f;
  topk_topp.temperature = 1.0f;
  topk_topp.top_k = 64;
  topk_topp.top_p = 0.95f;
  const bool graphs = be.name() == "cuda";
  const DecodeResult plain = time_decode(s, be, prompt, Sampler(greedy), o.gen, false);
  const DecodeResult graph_greedy = graphs ? time_decode(s, be, prompt, Sampler(greedy), o.gen, true) : plain;
  const DecodeResult graph_sampled = graphs ? time_decode(s, be, prompt, Sampler(topk_topp), o.gen, true)
                                            : time_decode(s, be, prompt, Sampler(topk_topp), o.gen, false);

  // The sampler alone on the last logits, back to back.
  const SamplingRows params = be.alloc_sampling_rows(1);
  const Tensor token = be.alloc(DType::I64, 1, 1);
  be.upload_sampling_rows({&topk_topp, 1}, params);
  be.sample(s.last_logits(), params, token);
  be.synchronize();
  const int kSamples = 200;
  const double sample_s = seconds_of([&] {
    for (int i = 0; i < kSamples; ++i) be.sample(s.last_logits(), params, token);
    be.synchronize();
  }) / kSamples;

  // Where the time goes: the decode matmul on the largest and a small matrix, prefill attention.
  const LayerWeights& l0 = model->weights().layers.front();
  const double gemv_lm_head = gemv_bandwidth(be, model->weights().lm_head), gemv_mlp = gemv_bandwidth(be, l0.gate_proj),
               gemv_small = gemv_bandwidth(be, l0.k_proj);
  double prefill_attention_s = 0;
  for (const LayerConfig& l : c.layers) prefill_attention_s += attention_seconds(be, c, l, o.prompt_len);
  const double prefill_matmul_s = prefill_matmul_seconds(be, *model, o.prompt_len);

  const double bytes = weight_bytes_per_step(*model);
  const double achieved = bytes / (graph_greedy.step_ms * 1e-3);
  nlohmann::json r = {
      {"model", o.synthetic.empty() ? o.model_path : "synthetic-" + o.synthetic},
      {"backend", be.name()},
      {"weights", o.synthetic.empty() ? "the file's" : o.weights},
      {"embedding_type", dtype_name(model->weights().embed.dtype)},  // also the tied LM head
      {"weight_bytes_by_type", weight_bytes_json(model->weights())},
      {"load_s", load_s},
      {"prompt_len", o.prompt_len},
      {"prefill_s_median", prefill_s[prefill_s.size() / 2]},
      {"prefill_s_best", prefill_s.front()},
      {"prefill_tok_s", double(o.prompt_len) / prefill_s[prefill_s.size() / 2]},
      {"gen", o.gen},
      {"decode_greedy_tok_s", plain.tok_s},
      {"decode_greedy_graph_tok_s", graph_greedy.tok_s},
      {"decode_topk_topp_graph_tok_s", graph_sampled.tok_s},
      {"step_ms_greedy_graph", graph_greedy.step_ms},
      {"weight_gb_per_step", bytes / 1e9},
      {"achieved_tb_s", achieved / 1e12},
      {"copy_tb_s", copy_bytes_per_s / 1e12},
      {"achieved_pct_of_copy", copy_bytes_per_s > 0 ? 100.0 * achieved / copy_bytes_per_s : 0.0},
      {"gemv_lm_head_tb_s", gemv_lm_head / 1e12},
      {"gemv_gate_proj_tb_s", gemv_mlp / 1e12},
      {"gemv_k_proj_tb_s", gemv_small / 1e12},
      {"prefill_attention_s", prefill_attention_s},
      {"prefill_matmul_s", prefill_matmul_s},
      {"sample_topk_topp_us", sample_s * 1e6},
      {"sampling_pct_of_step", 100.0 * sample_s / (graph_sampled.step_ms * 1e-3)},
  };
  r.update(kv_cache_json(s.runner().kv_pool()));
  if (!o.draft_model.empty()) r.update(drafted_decode_report(o, *model, be, s, prompt, topk_topp));
  std::printf("%s\n", r.dump(1).c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark prefill, decode and sampling (synthetic 31B or a model)");
  cmd->add_option("--synthetic", opts->synthetic, "Random weights generated on the GPU in this shape: 31b");
  cmd->add_option("--model_path,--model-path", opts->model_path, "A model directory instead of --synthetic");
  cmd->add_option("--weights", opts->weights,
                  "Weight types of the synthetic model: bf16, q8_0, q4_0, q4_k (every matrix and the embedding), "
                  "q4_k_m (llama.cpp's mix, Q6_K embedding), or another block type (default bf16)");
  cmd->add_option("--prompt_len,--prompt-len", opts->prompt_len, "Prompt tokens to prefill (default 2048)");
  cmd->add_option("--gen", opts->gen, "Tokens to decode per measurement (default 128)");
  cmd->add_option("--json_schema", opts->json_schema,
                  "With --concurrency and --model_path: every sequence constrained by this JSON Schema file "
                  "(constrained decoding), ending where its JSON may end");
  cmd->add_option("--seed", opts->seed, "Seed of the weights, prompt and sampling");
  cmd->add_option("--concurrency", opts->concurrency,
                  "Sequence counts for the continuous-batching bench, e.g. 1,8,32,64 (each sequence: "
                  "--prompt_len prompt tokens, --gen generated)")
      ->delimiter(',');
  cmd->add_option("--held", opts->held,
                  "Sequence counts, e.g. 1,32: hold that many sequences of --prompt_len tokens at once (one prefill, "
                  "its caches copied into each sequence's own pages) and time --gen greedy decode steps over them")
      ->delimiter(',');
  cmd->add_flag("--suite", opts->suite,
                "One load, llama-bench's table: prompt processing at --suite_prompts tokens and greedy decode "
                "after --suite_contexts tokens of context (cut to the model's context)");
  cmd->add_option("--suite_prompts,--suite-prompts", opts->suite_prompts, "Prompt lengths of --suite")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--suite_contexts,--suite-contexts", opts->suite_contexts, "Decode contexts of --suite")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch_invariant,--batch-invariant", opts->batch_invariant,
                  "With --concurrency: false lets decode batches fill whole forwards (faster on CUDA for "
                  "weight types other than Q4_0; a sequence's tokens may then depend on its batch)")
      ->capture_default_str();
  cmd->add_flag("--cuda_graph,--cuda-graph", opts->cuda_graph,
                "With --concurrency: steps that only decode replay a CUDA graph recorded per batch size");
  cmd->add_option("--profile_steps,--profile-steps", opts->profile_steps,
                  "With --concurrency: bracket this many full decode steps of each run (from the fifth) for a "
                  "profiler started with collection off (ncu --profile-from-start off)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--backend", opts->backend, "cuda or cpu")->check(CLI::IsMember({"cpu", "cuda"}));
  add_kv_type_flags(*cmd, opts->kv);
  add_bf16_weight_copies_flag(*cmd, opts->bf16_weight_copies);
  cmd->add_option("--draft_model,--draft-model", opts->draft_model,
                  "Also decode in draft rounds with this MTP assistant, greedily and sampled (drafted tok/s, "
                  "acceptance, draft and verify time); 'demo': the demo model's; 'synthetic' with --synthetic 31b: the 31B assistant's "
                  "shape, random weights");
  cmd->add_option("--draft_accept,--draft-accept", opts->draft_accept,
                  "Force this many drafts a round (a mean: 2.5 alternates 2 and 3) to stand: the rounds' drafts "
                  "replaced by the target's own greedy tokens, to measure a given acceptance");
  cmd->add_option("--draft_tokens,--draft-tokens", opts->draft_tokens,
                  "Tokens the assistant drafts a round (default: the assistant's num_assistant_tokens, else 4)");
  cmd->add_option("--tp", opts->tp,
                  "Split the model over this many ranks (tensor parallel: GPUs 0..N-1, or CPU threads): "
                  "prefill, decode (eager, and graph replay on CUDA) and the collectives' share of a step");
  cmd->add_option("--tp_all_reduce,--tp-all-reduce", opts->tp_all_reduce,
                  "How CUDA ranks sum: peer (one kernel over peer memory when the GPUs reach each other's, "
                  "else NCCL) or nccl")
      ->check(CLI::IsMember({"peer", "nccl"}))
      ->capture_default_str();
  cmd->callback([opts] { run_bench(*opts); });
}

}  // namespace g4::cli
