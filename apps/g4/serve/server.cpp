#include "serve/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>

#include "serve/openai_api.h"
#include "serve/reply_text.h"
#include "tokenizer/chat_template.h"
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

void send_error(httplib::Response& res, const ApiError& error) { send_json(res, error.status, error_json(error)); }

// How one generation ended, as the handler saw it.
struct Outcome {
  std::string finish_reason;  // "stop" or "length"; empty when it did not finish
  int64_t completion_tokens = 0;
  std::string failure;        // the engine failed (HTTP 500)
  bool client_gone = false;   // on_text refused a piece: the request was cancelled
};

// Turns the channel's tokens into text through `text`, giving on_text every piece that is safe to
// send; on_text returns false when the client has gone. A stop string, or a client that went
// away, cancels the request at once so that its KV memory comes back.
Outcome collect(EngineWorker& worker, const std::shared_ptr<RequestChannel>& channel, ReplyText& text,
                const std::function<bool(const std::string&)>& on_text) {
  Outcome outcome;
  std::string rest;  // the last piece, sent once the ending is known
  for (bool ended = false; !ended;) {
    const std::vector<DecodedToken> tokens = channel->take();
    if (tokens.empty()) {
      outcome.failure = channel->failure();
      return outcome;
    }
    for (const DecodedToken& t : tokens) {
      if (t.stop == StopReason::kStopToken || t.stop == StopReason::kCancelled) {
        rest = text.finish();
        outcome.finish_reason = "stop";
        ended = true;
        break;
      }
      ++outcome.completion_tokens;
      std::string piece = text.push(t.token);
      if (text.stopped()) {
        if (!t.last()) worker.cancel(channel);
        rest = std::move(piece);
        outcome.finish_reason = "stop";
        ended = true;
        break;
      }
      if (t.last()) {  // max_tokens or a full context
        rest = piece + text.finish();
        outcome.finish_reason = "length";
        ended = true;
        break;
      }
      if (!piece.empty() && !on_text(piece)) {
        worker.cancel(channel);
        outcome.client_gone = true;
        return outcome;
      }
    }
  }
  if (!rest.empty() && !on_text(rest)) outcome.client_gone = true;
  return outcome;
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
    : worker_(worker), tokenizer_(tokenizer), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  add_routes();
}

Server::~Server() { stop(); }

int Server::bind(const std::string& host, int port) {
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  G4_CHECK(bound > 0, "cannot listen on " + host + ":" + std::to_string(port) +
                          " (address in use, or not an address of this machine)");
  return bound;
}

void Server::listen() { http_->listen_after_bind(); }

void Server::stop() {
  if (http_->is_running()) http_->stop();
}

void Server::add_routes() {
  // Bearer authentication for the API; /health stays open for load balancers.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'", "",
                             "invalid_request_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own answers (404, a bad request line) in the same error shape.
  http_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(res.status, res.status == 404 ? "no route " + req.method + " " + req.path
                                                           : "HTTP error " + std::to_string(res.status)));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, what, "", "server_error"));
  });

  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", options_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "g4"}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Endpoint::kChat);
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Endpoint::kCompletion);
  });
}

void Server::complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  try {
    const CompletionRequest r = parse_completion_request(req.body, endpoint);
    const Sampler sampler = request_sampler(r, options_.default_sampler, options_.random_seed);
    const char* prompt_field = endpoint == Endpoint::kChat ? "messages" : "prompt";
    const std::vector<int32_t> prompt =
        endpoint == Endpoint::kChat ? tokenizer_.encode(format_gemma4_chat(r.messages), /*parse_special=*/true)
                                    : encode_prompt(tokenizer_, r.prompt, /*raw_prompt=*/true, options_.bos_id);
    // One position at least must stay free for a generated token.
    const int64_t room = worker_.max_seq_len() - int64_t(prompt.size());
    if (room < 1)
      throw ApiError(400,
                     "the prompt is " + std::to_string(prompt.size()) + " tokens; the context holds " +
                         std::to_string(worker_.max_seq_len()) + " (--max_seq_len), including the reply",
                     prompt_field);
    SchedulerRequest scheduled;
    scheduled.prompt = prompt;
    scheduled.sampling = sampler.params();
    scheduled.max_new_tokens = std::min(r.max_tokens.value_or(options_.default_max_tokens), room);
    scheduled.stop_ids = options_.stop_ids;
    std::shared_ptr<RequestChannel> channel = worker_.submit(std::move(scheduled));
    if (!channel)
      throw ApiError(503, "the server is busy: every session is running and the queue is full; try again later", "",
                     "server_busy");
    if (std::optional<std::string> why = channel->wait_admitted()) throw ApiError(400, *why);

    const ResponseHeader header{response_id(endpoint), options_.model_id,
                                std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count(),
                                endpoint};
    const int64_t prompt_tokens = int64_t(prompt.size());
    if (!r.stream) {
      ReplyText text(tokenizer_, r.stop);
      std::string content;
      const Outcome outcome = collect(worker_, channel, text, [&](const std::string& piece) {
        content += piece;
        return true;
      });
      if (!outcome.failure.empty()) throw ApiError(500, outcome.failure, "", "server_error");
      send_json(res, 200, completion_json(header, content, outcome.finish_reason,
                                          {prompt_tokens, outcome.completion_tokens}));
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, channel, header, prompt_tokens, stops = r.stop, include_usage = r.include_usage](
            size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            const std::string event = "data: " + data + "\n\n";
            return sink.write(event.data(), event.size());
          };
          if (header.endpoint == Endpoint::kChat && !send(dump(role_chunk_json(header)))) {
            worker_.cancel(channel);
            return false;
          }
          ReplyText text(tokenizer_, stops);
          const Outcome outcome = collect(worker_, channel, text, [&](const std::string& piece) {
            return send(dump(chunk_json(header, piece, "")));
          });
          if (outcome.client_gone) return false;
          if (!outcome.failure.empty()) {
            send(dump(error_json(ApiError(500, outcome.failure, "", "server_error"))));
          } else {
            send(dump(chunk_json(header, "", outcome.finish_reason)));
            if (include_usage) send(dump(usage_chunk_json(header, {prompt_tokens, outcome.completion_tokens})));
          }
          send("[DONE]");
          sink.done();
          return true;
        },
        // The connection broke before the stream ended: the request must not run on for nobody.
        [this, channel](bool success) {
          if (!success) worker_.cancel(channel);
        });
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const Error& e) {
    send_error(res, ApiError(400, e.what()));  // e.g. a prompt the tokenizer refuses
  }
}

}  // namespace g4::serve
