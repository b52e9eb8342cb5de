// The server's client connections, kept from holding what other clients need (docs/DESIGN.md §8):
//
// - ThreadPerConnection: httplib's task queue, one thread per connection up to a cap (then
//   connections wait for a thread), so a slow or idle connection holds only its own thread and
//   /health, /metrics and the 429s are answered whatever the other connections do.
// - ConnectionWatch: a thread that finds the listening port's connections in the kernel's table of
//   this process's sockets (httplib hands a handler no socket) and shuts down each one that has
//   not delivered a whole request (headers and body) within the deadline since it opened or since
//   its last answer; and, for a handler, whether its client has hung up (so that a request nobody
//   waits for stops generating).
#pragma once
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace g4::serve {

class ThreadPerConnection final : public httplib::TaskQueue {
 public:
  explicit ThreadPerConnection(size_t max_threads);
  ~ThreadPerConnection() override;
  void enqueue(std::function<void()> fn) override;
  // Returns once every connection's thread has ended (httplib calls it when the server stops).
  void shutdown() override;

 private:
  void run(std::function<void()> fn);

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> waiting_;
  size_t running_ = 0;
};

class ConnectionWatch {
 public:
  // Watches the connections accepted on `port` (this process's sockets with that local port and a
  // peer) every `interval`.
  ConnectionWatch(int port, std::chrono::milliseconds request_deadline,
                  std::chrono::milliseconds interval = std::chrono::milliseconds(100));
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // The handler of the client at remote_addr:remote_port has the whole request (httplib's
  // pre-routing handler runs before the body is read: call this from a route's handler): no
  // deadline until end_request. Returns the connection's socket, or -1 when it is not found.
  int begin_request(const std::string& remote_addr, int remote_port);
  // Its answer is written: the next request's deadline starts now.
  void end_request(const std::string& remote_addr, int remote_port);
  // Whether the client of `socket` (from begin_request) has closed its end or the connection broke.
  static bool client_gone(int socket);
  // Shuts down every connection, busy or not (the server's drain deadline passed).
  void close_all();

 private:
  struct Connection {
    int socket = -1;
    std::chrono::steady_clock::time_point deadline;  // meaningless while busy
    bool busy = false;
    bool seen = false;  // found in the latest scan
  };
  void watch();
  void scan();
  static std::string key(const std::string& addr, int port);

  const int port_;
  const std::chrono::milliseconds request_deadline_, interval_;
  mutable std::mutex mutex_;
  // Held through a whole scan, from listing the sockets to updating connections_: a scan that
  // listed them before a connection arrived must not end after that connection's begin_request,
  // or it would forget a busy connection, and the next scan would find it idle and close it.
  std::mutex scanning_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::map<std::string, Connection> connections_;  // by the peer's "addr:port"
  std::thread thread_;
};

}  // namespace g4::serve
