#include "serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <span>

#include "sampling/sampling_settings.h"
#include "serve/openai_api.h"
#include "serve/reply_assembler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/gemma4_output_parser.h"
#include "util/error.h"

namespace g4::serve {

using nlohmann::json;

namespace {

// Replies hold only whole characters, but a request's own strings are echoed nowhere unchecked:
// replace, never throw, on bytes that are not UTF-8.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// Every error answer goes out here: the status from the error's kind, and Retry-After where the
// same request may succeed later.
void send_error(httplib::Response& res, const ApiError& error, int retry_after_seconds = 1) {
  if (error.kind() == ErrorKind::kBusy) res.set_header("Retry-After", std::to_string(retry_after_seconds));
  send_json(res, error.status, error_json(error));
}

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// How one generation ended, as the handler saw it.
struct Outcome {
  std::string finish_reason;  // "stop", "length" or "tool_calls"; empty when it did not finish
  int64_t completion_tokens = 0;
  std::optional<Error> failure;  // the request or the engine failed (its kind gives the status)
  bool client_gone = false;   // on_part refused a part: the request was cancelled
};

// Times tokens as the handler receives them: the first from the request's arrival, each later one
// from the one before (tokens that arrive together share the interval).
class TokenTimer {
 public:
  TokenTimer(Metrics& metrics, Clock::time_point arrived) : metrics_(metrics), last_(arrived) {}
  void received(size_t tokens) {
    if (tokens == 0) return;
    const Clock::time_point now = Clock::now();
    const double interval = seconds_between(last_, now);
    size_t decode_tokens = tokens;
    if (first_) {
      metrics_.observe_time_to_first_token(interval);
      first_ = false;
      --decode_tokens;
    }
    for (size_t i = 0; i < decode_tokens; ++i) metrics_.observe_decode_token(interval / double(tokens));
    last_ = now;
  }

 private:
  Metrics& metrics_;
  Clock::time_point last_;
  bool first_ = true;
};

// Gives on_part every part of the reply that is safe to send; on_part returns false when the
// client has gone. A stop string, or a client that went away, cancels the request at once so that
// its KV memory comes back.
Outcome collect(EngineWorker& worker, const std::shared_ptr<RequestChannel>& channel, ReplyAssembler& reply,
                TokenTimer& timer, const std::function<bool(ReplyPart)>& on_part) {
  Outcome outcome;
  ReplyPart rest;  // the last part, sent once the ending is known
  for (bool ended = false; !ended;) {
    const std::vector<SequenceEvent> tokens = channel->take();
    if (tokens.empty()) {
      outcome.failure = channel->failure();
      return outcome;
    }
    timer.received(size_t(std::count_if(tokens.begin(), tokens.end(), [](const SequenceEvent& e) {
      return e.drawn.stop != StopReason::kCancelled;
    })));
    for (const SequenceEvent& t : tokens) {
      if (t.drawn.stop == StopReason::kStopToken || t.drawn.stop == StopReason::kCancelled) {
        rest.append(reply.finish());
        outcome.finish_reason = "stop";
        ended = true;
        break;
      }
      ++outcome.completion_tokens;
      ReplyPart part = reply.push(t);
      if (reply.stopped() || t.drawn.last()) {
        if (reply.stopped() && !t.drawn.last()) worker.cancel(channel);
        if (!reply.stopped()) part.append(reply.finish());  // max_tokens or a full context
        outcome.finish_reason = reply.stopped() ? "stop" : "length";
        rest.append(std::move(part));
        ended = true;
        break;
      }
      if (!part.empty() && !on_part(std::move(part))) {
        worker.cancel(channel);
        outcome.client_gone = true;
        return outcome;
      }
    }
  }
  if (!rest.empty() && !on_part(std::move(rest))) outcome.client_gone = true;
  if (outcome.finish_reason == "stop" && reply.made_tool_calls()) outcome.finish_reason = "tool_calls";
  return outcome;
}

// The label of a request in g4_requests_total: its route, or "other" (no label per unknown path).
std::string endpoint_label(const std::string& path) {
  for (const char* route : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == route) return path;
  return "other";
}

std::string response_id(Endpoint endpoint) {
  static std::atomic<uint64_t> next{1};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::string(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") +
         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now).count()) + "-" +
         std::to_string(next++);
}

}  // namespace

Server::Server(EngineWorker& worker, const Tokenizer& tokenizer, ServerOptions options)
    : worker_(worker),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      grammars_(tokenizer, options_.stop_ids, worker.vocab_size()),
      http_(std::make_unique<httplib::Server>()) {
  // A streamed answer holds its HTTP thread to the end, and a slow client holds its own: one thread
  // per connection (docs/DESIGN.md §8).
  if (options_.max_connections == 0) options_.max_connections = std::max<size_t>(1024, 2 * worker_.max_in_flight() + 64);
  G4_CHECK(options_.max_connections > worker_.max_in_flight(),
           "max_connections (" + std::to_string(options_.max_connections) + ") must exceed the requests in flight (" +
               std::to_string(worker_.max_in_flight()) + ")");
  const size_t threads = options_.max_connections;
  http_->new_task_queue = [threads] { return new ThreadPerConnection(threads); };
  // httplib's options for the listening socket, and the socket itself: bind() widens its backlog.
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listening_socket_ = sock;
  });
  http_->set_keep_alive_max_count(options_.keep_alive_requests);
  http_->set_keep_alive_timeout(options_.keep_alive_idle.count());
  add_routes();
}

Server::~Server() {
  stop();
  if (drain_.joinable()) drain_.join();
}

int Server::bind(const std::string& host, int port) {
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  G4_CHECK(bound > 0, "cannot listen on " + host + ":" + std::to_string(port) +
                          " (address in use, or not an address of this machine)");
  // httplib listens with a backlog of 5: a burst of connections beyond it waits for the clients'
  // SYN retransmission (a second or more) or is reset. Listening again sets the backlog (the kernel
  // caps it at net.core.somaxconn).
  G4_CHECK(::listen(listening_socket_, int(std::min<size_t>(options_.max_connections, 65535))) == 0,
           "cannot widen the listen backlog of " + host + ":" + std::to_string(bound));
  connections_ = std::make_unique<ConnectionWatch>(bound, options_.request_deadline);
  return bound;
}

void Server::listen() {
  {
    std::lock_guard lock(drain_mutex_);
    if (stop_requested_) return;
    listening_ = true;
  }
  http_->listen_after_bind();
  std::lock_guard lock(drain_mutex_);
  listening_ = false;
  drained_.notify_all();
}

// httplib's stop() acts only on a running server: the flag covers a stop() that comes first.
void Server::stop() {
  std::lock_guard lock(drain_mutex_);
  if (stop_requested_.exchange(true) || !listening_) return;
  http_->stop();
  drain_ = std::thread([this] {
    std::unique_lock lock(drain_mutex_);
    if (drained_.wait_for(lock, options_.drain_deadline, [this] { return !listening_; })) return;
    lock.unlock();
    worker_.fail_in_flight(Error(ErrorKind::kUnavailable,
                                 "the server is stopping: requests still running at its drain deadline are cancelled"));
    // The failed requests' handlers answer at once; connections that still hold a thread then
    // (an idle keep-alive, a slow client) are closed.
    lock.lock();
    if (drained_.wait_for(lock, std::chrono::seconds(1), [this] { return !listening_; })) return;
    lock.unlock();
    if (connections_) connections_->close_all();
  });
}

void Server::add_routes() {
  // Bearer authentication for the API; /health stays open for load balancers.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(ErrorKind::kUnauthenticated,
                             "a valid API key is required: send 'Authorization: Bearer <key>'", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own answers (404, 413, a bad request line) in the same error shape. Those other than
  // 404 and 413 keep the status httplib chose (its protocol answers: 400, 414, 416...).
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      send_error(res, ApiError(ErrorKind::kNotFound, "no route " + req.method + " " + req.path, "", "not_found"));
    } else if (res.status == 413) {
      send_error(res, ApiError(ErrorKind::kTooLarge, "the request body is larger than the server's limit of " +
                                                         std::to_string(options_.max_body_bytes) + " bytes",
                               "", "request_too_large"));
    } else {
      const int status = res.status;
      send_json(res, status, error_json(ApiError(ErrorKind::kInvalidArgument, "HTTP error " + std::to_string(status))));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {  // after the answer
    if (connections_) connections_->end_request(req.remote_addr, req.remote_port);
    metrics_.count_request(endpoint_label(req.path), res.status);
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      send_error(res, ApiError(e));
    } catch (const std::exception& e) {
      send_error(res, ApiError(ErrorKind::kInternal, e.what()));
    } catch (...) {
      send_error(res, ApiError(ErrorKind::kInternal, "internal error"));
    }
  });

  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(worker_.gauges()), "text/plain; version=0.0.4");
  });
  const json model = {{"id", options_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "g4"}};
  http_->Get("/v1/models", [model](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  http_->Get(R"(/v1/models/(.+))", [this, model](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == options_.model_id) return send_json(res, 200, model);
    send_error(res, ApiError(ErrorKind::kNotFound,
                             "the model '" + std::string(req.matches[1]) + "' does not exist: this server serves '" +
                                 options_.model_id + "'",
                             "model", "model_not_found"));
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Endpoint::kChat);
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Endpoint::kCompletion);
  });
  // A known route asked with another method is a 405 naming the one it takes, not a 404.
  auto only = [this](const std::string& pattern, const std::string& method) {
    const httplib::Server::Handler refuse = [method](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", method);
      send_error(res, ApiError(ErrorKind::kMethodNotAllowed, req.method + " " + req.path + " is not served: use " + method,
                               "", "method_not_allowed"));
    };
    if (method != "GET") http_->Get(pattern, refuse);
    if (method != "POST") http_->Post(pattern, refuse);
    http_->Put(pattern, refuse);
    http_->Patch(pattern, refuse);
    http_->Delete(pattern, refuse);
  };
  for (const char* pattern : {"/health", "/metrics", "/v1/models", R"(/v1/models/(.+))"}) only(pattern, "GET");
  for (const char* pattern : {"/v1/chat/completions", "/v1/completions"}) only(pattern, "POST");
}

std::vector<std::vector<int32_t>> Server::prompt_ids(const CompletionRequest& r) const {
  std::vector<std::vector<int32_t>> prompts;
  if (r.endpoint == Endpoint::kChat) prompts.push_back(tokenizer_.encode(format_gemma4_chat(r.messages, r.chat), true));
  for (const CompletionPrompt& p : r.prompts) {
    if (!p.ids) {
      prompts.push_back(encode_prompt(tokenizer_, p.text, /*raw_prompt=*/true, options_.bos_id));
      continue;
    }
    for (int32_t id : *p.ids)
      if (id >= tokenizer_.vocab_size())
        throw ApiError(ErrorKind::kInvalidArgument,
                       "'prompt' holds token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                           std::to_string(tokenizer_.vocab_size()) + ")",
                       "prompt");
    prompts.push_back(*p.ids);
  }
  const char* param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  for (const std::vector<int32_t>& prompt : prompts)  // one position at least stays free for a token
    if (int64_t(prompt.size()) >= worker_.max_seq_len())
      throw ApiError(ErrorKind::kInvalidArgument,
                     "the prompt is " + std::to_string(prompt.size()) + " tokens; the context holds " +
                         std::to_string(worker_.max_seq_len()) + " (--max_seq_len), including the reply",
                     param, "context_length_exceeded");
  return prompts;
}

LogitPenalties Server::request_penalties(const CompletionRequest& r) const {
  LogitPenalties p = r.penalties;
  for (const auto& [token, bias] : p.bias)
    if (token >= tokenizer_.vocab_size())
      throw ApiError(ErrorKind::kInvalidArgument,
                     "'logit_bias' names token " + std::to_string(token) + ", outside the vocabulary [0, " +
                         std::to_string(tokenizer_.vocab_size()) + ")",
                     "logit_bias");
  // Tools declared but tool_choice "none": the template still shows the tools, so the call marker
  // is banned rather than left to the model.
  if (r.endpoint == Endpoint::kChat && !r.chat.tools.empty() && !r.parse_tool_calls)
    if (std::optional<int32_t> open = tokenizer_.token_id(kToolCallOpen)) p.banned.push_back(*open);
  return p;
}

// One choice's generation: its channel, the assembler of its reply and what it echoes first.
struct Server::Choice {
  std::shared_ptr<RequestChannel> channel;
  std::shared_ptr<ReplyAssembler> reply;
  int64_t prompt_tokens = 0;  // its prompt's, on the prompt's first choice (usage counts a prompt once)
  std::string echo;
};

void Server::cancel_all(const std::vector<Choice>& choices) {
  for (const Choice& c : choices) worker_.cancel(c.channel);
}

void Server::submit_choices(const CompletionRequest& r, std::vector<Choice>& choices) {
  const Sampler sampler = request_sampler(r, options_.default_sampler, options_.random_seed);
  const std::vector<std::vector<int32_t>> prompts = prompt_ids(r);
  const LogitPenalties penalties = request_penalties(r);
  const std::shared_ptr<const grammar::CompiledGrammar> grammar = grammars_.get(r);
  const size_t count = prompts.size() * size_t(r.n);
  if (count > worker_.max_in_flight())
    throw ApiError(ErrorKind::kInvalidArgument,
                   "the request asks for " + std::to_string(count) + " choices; this server runs and queues at most " +
                       std::to_string(worker_.max_in_flight()) + " requests at once (--max_sessions plus --max_waiting)",
                   r.n > 1 ? "n" : "prompt");
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t j = 0; j < r.n; ++j) {
      SchedulerRequest scheduled;
      scheduled.prompt = prompts[i];
      scheduled.sampling = sampler.params();
      scheduled.sampling.seed = choice_seed(scheduled.sampling.seed, uint64_t(j));
      scheduled.max_new_tokens = std::min(r.max_tokens.value_or(options_.default_max_tokens),
                                          worker_.max_seq_len() - int64_t(prompts[i].size()));
      scheduled.stop_ids = options_.stop_ids;
      scheduled.top_logprobs = r.top_logprobs;
      scheduled.penalties = penalties;
      scheduled.grammar = grammar;
      Choice c;
      try {
        c.channel = worker_.submit(std::move(scheduled));
      } catch (const Error& e) {
        throw ApiError(e.kind(), e.what(), "", e.kind() == ErrorKind::kBusy ? "server_busy" : "");
      }
      c.reply = std::make_shared<ReplyAssembler>(tokenizer_, r);
      c.prompt_tokens = j == 0 ? int64_t(prompts[i].size()) : 0;
      if (r.echo) c.echo = r.prompts[i].ids ? tokenizer_.decode(*r.prompts[i].ids) : r.prompts[i].text;
      choices.push_back(std::move(c));
    }
}

void Server::answer_whole(const std::vector<Choice>& choices, const ResponseHeader& header, bool with_logprobs,
                          Clock::time_point arrived, int socket, httplib::Response& res) {
  // A client that hung up cancels its requests at the next token, as a stream's would.
  std::vector<ChoiceReply> replies;
  Usage usage;
  TokenTimer timer(metrics_, arrived);
  for (const Choice& c : choices) {
    ChoiceReply reply{ReplyPart{c.echo, {}, {}, {}}, ""};
    const Outcome outcome = collect(worker_, c.channel, *c.reply, timer, [&](ReplyPart part) {
      reply.reply.append(std::move(part));
      return !ConnectionWatch::client_gone(socket);
    });
    metrics_.count_tokens(c.prompt_tokens, outcome.completion_tokens);
    if (outcome.client_gone) {  // nobody reads an answer; logged as nginx logs it
      cancel_all(choices);
      res.status = http_status(ErrorKind::kCancelled);
      return;
    }
    if (outcome.failure) throw ApiError(*outcome.failure);
    reply.finish_reason = outcome.finish_reason;
    replies.push_back(std::move(reply));
    usage.prompt_tokens += c.prompt_tokens;
    usage.completion_tokens += outcome.completion_tokens;
  }
  send_json(res, 200, completion_json(header, replies, usage, with_logprobs));
}

void Server::answer_stream(std::vector<Choice> choices, const ResponseHeader& header, bool with_logprobs,
                           bool include_usage, Clock::time_point arrived, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  // The choices stream one after another (each chunk names its choice's index); they generate
  // together, the later ones' tokens waiting in their channels.
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, choices, header, with_logprobs, arrived, include_usage](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& data) {
          const std::string event = "data: " + data + "\n\n";
          return sink.write(event.data(), event.size());
        };
        Usage usage;
        TokenTimer timer(metrics_, arrived);
        for (size_t i = 0; i < choices.size(); ++i) {
          const Choice& c = choices[i];
          const bool opened = header.endpoint == Endpoint::kChat ? send(dump(role_chunk_json(header, i)))
                              : c.echo.empty()                   ? true
                                  : send(dump(chunk_json(header, ReplyPart{c.echo, {}, {}, {}}, "", with_logprobs, i)));
          if (!opened) {
            cancel_all(choices);
            return false;
          }
          const Outcome outcome = collect(worker_, c.channel, *c.reply, timer, [&](ReplyPart part) {
            return send(dump(chunk_json(header, part, "", with_logprobs, i)));
          });
          metrics_.count_tokens(c.prompt_tokens, outcome.completion_tokens);
          if (outcome.client_gone) {
            cancel_all(choices);
            return false;
          }
          if (outcome.failure) {
            cancel_all(choices);
            send(dump(error_json(ApiError(*outcome.failure))));
            break;
          }
          send(dump(chunk_json(header, {}, outcome.finish_reason, with_logprobs, i)));
          usage.prompt_tokens += c.prompt_tokens;
          usage.completion_tokens += outcome.completion_tokens;
          if (i + 1 == choices.size() && include_usage) send(dump(usage_chunk_json(header, usage)));
        }
        send("[DONE]");
        sink.done();
        return true;
      },
      // The connection broke before the stream ended: the requests must not run on for nobody.
      [this, choices](bool success) {
        if (!success) cancel_all(choices);
      });
}

void Server::complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  const Clock::time_point arrived = Clock::now();
  // The request is read whole: no deadline while it generates (the other routes answer at once).
  const int socket = connections_ ? connections_->begin_request(req.remote_addr, req.remote_port) : -1;
  std::vector<Choice> choices;
  try {
    const CompletionRequest r = parse_completion_request(req.body, endpoint);
    if (r.model && *r.model != options_.model_id)
      throw ApiError(ErrorKind::kNotFound,
                     "the model '" + *r.model + "' does not exist: this server serves '" + options_.model_id + "'",
                     "model", "model_not_found");
    // Every choice is submitted before any is awaited, so that they run batched; one refused
    // cancels those already in.
    submit_choices(r, choices);
    for (const Choice& c : choices)
      if (std::optional<Error> why = c.channel->wait_admitted()) throw ApiError(*why);
    const ResponseHeader header{response_id(endpoint), options_.model_id,
                                std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count(),
                                endpoint};
    const bool with_logprobs = r.top_logprobs >= 0;
    if (r.stream)
      answer_stream(std::move(choices), header, with_logprobs, r.include_usage, arrived, res);
    else
      answer_whole(choices, header, with_logprobs, arrived, socket, res);
  } catch (const ApiError& e) {
    cancel_all(choices);
    send_error(res, e, options_.retry_after_seconds);
  } catch (const Error& e) {  // e.g. a prompt the tokenizer refuses
    cancel_all(choices);
    send_error(res, ApiError(e), options_.retry_after_seconds);
  }
}

}  // namespace g4::serve
