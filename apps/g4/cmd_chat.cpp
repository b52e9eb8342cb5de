// g4 chat: a multi-turn conversation in the terminal (or through a pipe). The KV cache is kept
// between turns, so each turn prefills only what the cache does not hold yet. With --tp N every
// rank holds its own conversation over its shard; rank 0 reads the input, hands each line to the
// others (RankInputs, docs/DESIGN.md §9 "Front ends") and prints.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "generation_flags.h"
#include "runtime/generator.h"
#include "runtime/rank_inputs.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4::cli {

namespace {

struct ChatOptions {
  GenerationFlags gen;
  std::string system;
};

// Ctrl-C while a reply streams ends that reply; at the prompt it ends the program as usual.
std::atomic<bool> g_stop_reply{false};
std::atomic<bool> g_replying{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT handler needs a lock-free flag");

extern "C" void on_sigint(int) {
  if (g_replying.load()) {
    g_stop_reply.store(true);
    return;
  }
  const char newline = '\n';
  (void)!write(STDOUT_FILENO, &newline, 1);
  signal(SIGINT, SIG_DFL);
  raise(SIGINT);
}

// Installs on_sigint for the session's lifetime and puts the previous handler back.
class SigintGuard {
 public:
  SigintGuard() {
    struct sigaction action {};
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a Ctrl-C must not break the read of the next line
    sigaction(SIGINT, &action, &previous_);
  }
  ~SigintGuard() { sigaction(SIGINT, &previous_, nullptr); }
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  struct sigaction previous_ {};
};

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r\n") + 1 - first);
}

// What rank 0 read: a user turn, a reset, or the end of the conversation; and during a reply,
// for each token, whether a Ctrl-C stops the reply there. With --tp > 1 these are what the other
// ranks receive, so that every rank runs the same turns and stops at the same token
// (docs/DESIGN.md §9).
struct ChatInput {
  enum class Kind { kTurn, kReset, kEnd, kReplyGoesOn, kReplyStops } kind = Kind::kEnd;
  std::string text;
};

// A split model's rank failed while generating a reply: fatal, unlike an Error the chat survives.
struct FailedMidReply : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The conversation as token ids. Each reply passes the whole history to the session, which
// keeps what its caches hold (every earlier turn but, at most, a reply's last token: generation
// stops before feeding the token that hit max_new_tokens or a Ctrl-C) and prefills the rest.
class Conversation {
 public:
  // `inputs`: rank 0's inputs to a split model's ranks (nullptr unsplit).
  Conversation(Engine& engine, const Tokenizer& tokenizer, const ChatOptions& options, ResolvedSampling sampling,
               RankInputs<ChatInput>* inputs)
      : rank_(engine.tp_rank()),
        speaks_(rank_ == 0),
        draft_(engine.draft_options()),
        inputs_(inputs),
        session_(engine.create_session()),
        tokenizer_(tokenizer),
        options_(options),
        sampling_(sampling),
        stop_ids_(stop_ids(options.gen, engine)),
        turn_end_(tokenizer.encode(std::string(kGemma4TurnEnd), /*parse_special=*/true)) {}

  void reset() {
    history_.clear();
    session_->reset();
  }

  void reply(const std::string& user_text) {
    std::vector<int32_t> turn;
    if (history_.empty()) {
      turn.push_back(options_.gen.bos_id);
      if (!options_.system.empty()) append(turn, "<|turn>system\n" + trim(options_.system) + std::string(kGemma4TurnEnd));
    }
    append(turn, format_gemma4_user_turn(user_text));

    GenerationRequest request;
    request.prompt = history_;
    request.prompt.insert(request.prompt.end(), turn.begin(), turn.end());
    request.sampler = sampling_.sampler.starting_at(int64_t(drawn_));  // every token of the conversation gets its own seed
    request.max_new_tokens = options_.gen.max_new_tokens;
    request.stop_ids = stop_ids_;
    request.graph = options_.gen.cuda_graph;
    request.penalties = flag_penalties(options_.gen);
    request.draft = draft_;
    // Unsplit, a Ctrl-C stops the reply at the next token. Split, every rank must stop at the
    // same token, so rank 0 reads the flag once per token and hands its answer to the others.
    std::atomic<bool> stop_here{false};
    request.stop = inputs_ ? &stop_here : &g_stop_reply;
    // Fails before running anything (and so leaves the conversation as it was) when the
    // context cannot take the turn.
    session_->check_input(request.prompt, 0);

    StreamDecoder text(tokenizer_, /*skip_special=*/true);
    g_stop_reply.store(false);
    g_replying.store(true);
    GenerationResult result;
    try {
      result = generate(*session_, request, [&](int32_t id) {
        if (inputs_) stop_here.store(agree_on_stop());
        if (!speaks_) return;
        std::fputs(text.push(id).c_str(), stdout);
        std::fflush(stdout);
      });
    } catch (const Error& e) {
      g_replying.store(false);
      // Split, a rank that fails while generating ends the run (its peers are mid-step, and no
      // other rank need have failed): not an Error, so the chat loop does not go on with it.
      if (inputs_ && !dynamic_cast<const PeerFailure*>(&e)) throw FailedMidReply(e.what());
      throw;  // history is unchanged; the session's caches say what they hold, so the next turn fits
    } catch (...) {
      g_replying.store(false);
      throw;
    }
    g_replying.store(false);

    // The reply as the model produced it, closed as the template closes a model turn.
    history_.insert(history_.end(), turn.begin(), turn.end());
    history_.insert(history_.end(), result.tokens.begin(), result.tokens.end());
    history_.insert(history_.end(), turn_end_.begin(), turn_end_.end());
    drawn_ += result.tokens.size() + 1;
    if (speaks_) report(request, result, text);
  }

 private:
  // Whether the reply stops after this token, the same on every rank of a split model.
  bool agree_on_stop() {
    if (!speaks_) return inputs_->next(rank_).kind == ChatInput::Kind::kReplyStops;
    const bool stop = g_stop_reply.load();
    inputs_->publish({stop ? ChatInput::Kind::kReplyStops : ChatInput::Kind::kReplyGoesOn, {}});
    return stop;
  }

  void report(const GenerationRequest& request, const GenerationResult& result, StreamDecoder& text) const {
    std::printf("%s\n", text.flush().c_str());
    std::fflush(stdout);

    const double tps = result.decode_seconds > 0 && result.tokens.size() > 1
                           ? double(result.tokens.size() - 1) / result.decode_seconds
                           : 0;
    std::fprintf(stderr, "[prefilled %zu tokens (cache %lld) in %.3f s; %zu tokens, %.1f tok/s%s; context %lld/%lld]\n",
                 size_t(result.prefilled), static_cast<long long>(int64_t(request.prompt.size()) - result.prefilled),
                 result.prefill_seconds, result.tokens.size(),
                 tps, result.stopped ? "; stopped"
                      : result.context_full ? "; context full, /reset to start again"
                      : result.stop_token < 0 && options_.gen.max_new_tokens > 0 ? "; --max_new_tokens reached"
                                                                                  : "",
                 static_cast<long long>(history_.size()), static_cast<long long>(session_->max_seq_len()));
    if (const SpeculationStats* drafting = session_->speculation_stats())
      std::fprintf(stderr, "[this conversation's %s]\n",
                   describe_drafting(*drafting, draft_.draft_tokens).c_str());
  }

  void append(std::vector<int32_t>& ids, const std::string& text) const {
    const std::vector<int32_t> more = tokenizer_.encode(text, /*parse_special=*/true);
    ids.insert(ids.end(), more.begin(), more.end());
  }

  const int rank_;
  const bool speaks_;
  const DraftOptions draft_;
  RankInputs<ChatInput>* const inputs_;
  std::unique_ptr<Session> session_;
  const Tokenizer& tokenizer_;
  const ChatOptions& options_;
  const ResolvedSampling sampling_;
  const std::vector<int32_t> stop_ids_, turn_end_;
  std::vector<int32_t> history_;
  uint64_t drawn_ = 0;
};


// The next input on standard input; chat commands other than /reset and /exit are answered here.
ChatInput read_chat_input(bool interactive) {
  for (std::string line;;) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) return {};
    line = trim(line);
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") return {};
    if (line == "/reset") return {ChatInput::Kind::kReset, {}};
    if (line[0] != '/') return {ChatInput::Kind::kTurn, line};
    std::fprintf(stderr, "unknown chat command '%s': /reset starts over, /exit quits\n", line.c_str());
  }
}

// One rank's conversation: the same turns on every rank, from rank 0's standard input (rank 0
// publishes each input before acting on it) or, on the others, from what rank 0 published.
void converse(const ChatOptions& o, const GenerationFlags& flags, Engine& engine, RankInputs<ChatInput>& inputs) {
  check_token_flags(flags, engine);
  const bool speaks = engine.tp_rank() == 0;
  const std::optional<Tokenizer> tokenizer = open_tokenizer(flags, engine);
  if (speaks) note_foreign_chat_template(engine);
  G4_CHECK(tokenizer, "chat needs a tokenizer: the model has none embedded; pass --tokenizer_path");
  const ResolvedSampling sampling = effective_sampling(flags, engine.generation_defaults(), speaks);
  const bool interactive = speaks && isatty(STDIN_FILENO);
  if (speaks)
    std::fprintf(stderr, "g4 chat (%s)%s\n", describe_sampling(sampling).c_str(),
                 interactive ? ". /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a reply." : "");

  Conversation conversation(engine, *tokenizer, o, sampling, engine.tp_size() > 1 ? &inputs : nullptr);
  std::optional<SigintGuard> sigint;
  if (speaks) sigint.emplace();
  for (;;) {
    ChatInput input;
    if (speaks) {
      input = read_chat_input(interactive);
      if (engine.tp_size() > 1) inputs.publish(input);
    } else {
      input = inputs.next(engine.tp_rank());
    }
    if (input.kind == ChatInput::Kind::kEnd) break;
    if (input.kind == ChatInput::Kind::kReset) {
      conversation.reset();
      if (speaks) std::fprintf(stderr, "[conversation reset]\n");
      continue;
    }
    try {
      conversation.reply(input.text);
    } catch (const PeerFailure&) {
      throw;  // the group failed: no rank can go on
    } catch (const Error& e) {
      // The turn did not run, on any rank (the same check fails on each); the conversation goes
      // on (e.g. after a full context, /reset).
      if (speaks) std::fprintf(stderr, "error: %s\n", e.what());
    }
  }
  if (interactive) std::fputs("\n", stdout);
}

void chat(const ChatOptions& o) {
  check_generation_flags(o.gen);
  GenerationFlags flags = o.gen;
  draw_seed_for_ranks(flags);
  RankInputs<ChatInput> inputs(flags.tp);
  run_with_inputs<ChatInput>(engine_options(flags), inputs, [&](Engine& engine) { converse(o, flags, engine, inputs); });
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->gen.max_new_tokens = 1024;  // a reply, not a benchmark: let the model finish its turn
  CLI::App* cmd = app.add_subcommand("chat", "Talk to a model turn by turn (reads lines from standard input)");
  add_generation_flags(*cmd, o->gen);
  cmd->add_option("--system", o->system, "A system turn put before the first user turn");
  cmd->footer("In the chat: /reset starts a new conversation, /exit (or end of input) quits, Ctrl-C stops the reply "
              "being written.");
  cmd->callback([o] { chat(*o); });
}

}  // namespace g4::cli
