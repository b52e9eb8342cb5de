#include "serve/connections.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace g4::serve {

ThreadPerConnection::ThreadPerConnection(size_t max_threads) : max_threads_(max_threads) {}

ThreadPerConnection::~ThreadPerConnection() { shutdown(); }

void ThreadPerConnection::enqueue(std::function<void()> fn) {
  std::lock_guard lock(mutex_);
  if (running_ >= max_threads_) {
    waiting_.push_back(std::move(fn));
    return;
  }
  ++running_;
  std::thread([this, fn = std::move(fn)]() mutable { run(std::move(fn)); }).detach();
}

// Runs `fn`, then whatever connections waited for a thread, then ends the thread.
void ThreadPerConnection::run(std::function<void()> fn) {
  for (;;) {
    fn();
    std::lock_guard lock(mutex_);
    if (waiting_.empty()) {
      --running_;
      idle_.notify_all();
      return;
    }
    fn = std::move(waiting_.front());
    waiting_.pop_front();
  }
}

void ThreadPerConnection::shutdown() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return running_ == 0; });
}

namespace {

// "addr:port" of a socket address, numeric, as httplib names a request's remote end.
std::string address_key(const sockaddr_storage& a, socklen_t length, int* port) {
  char host[NI_MAXHOST], service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), length, host, sizeof host, service, sizeof service,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "";
  *port = std::atoi(service);
  return std::string(host) + ":" + service;
}

// The peer of `fd` as "addr:port" when it is a connection accepted on `port`, else "".
std::string accepted_peer(int fd, int port) {
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof local, peer_length = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) return "";
  int local_port = -1, peer_port = -1;
  if (address_key(local, local_length, &local_port).empty() || local_port != port) return "";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) return "";  // the listener
  return address_key(peer, peer_length, &peer_port);
}

}  // namespace

ConnectionWatch::ConnectionWatch(int port, std::chrono::milliseconds request_deadline, std::chrono::milliseconds interval)
    : port_(port), request_deadline_(request_deadline), interval_(interval), thread_([this] { watch(); }) {}

ConnectionWatch::~ConnectionWatch() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string ConnectionWatch::key(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

int ConnectionWatch::begin_request(const std::string& remote_addr, int remote_port) {
  std::unique_lock lock(mutex_);
  auto at = connections_.find(key(remote_addr, remote_port));
  if (at == connections_.end()) {  // opened since the last scan
    lock.unlock();
    scan();
    lock.lock();
    at = connections_.find(key(remote_addr, remote_port));
    if (at == connections_.end()) return -1;
  }
  at->second.busy = true;
  return at->second.socket;
}

void ConnectionWatch::end_request(const std::string& remote_addr, int remote_port) {
  std::lock_guard lock(mutex_);
  const auto at = connections_.find(key(remote_addr, remote_port));
  if (at == connections_.end()) return;
  at->second.busy = false;
  at->second.deadline = std::chrono::steady_clock::now() + request_deadline_;
}

bool ConnectionWatch::client_gone(int socket) {
  if (socket < 0) return false;
  pollfd p{socket, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void ConnectionWatch::close_all() {
  scan();
  std::lock_guard lock(mutex_);
  for (const auto& [peer, c] : connections_)
    if (accepted_peer(c.socket, port_) == peer) ::shutdown(c.socket, SHUT_RDWR);
}

void ConnectionWatch::watch() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, interval_);
    if (stop_) return;
    lock.unlock();
    scan();
    lock.lock();
  }
}

// Brings connections_ up to date with the sockets open now, and shuts down every idle one past its
// deadline (its handler thread then sees the connection end and closes it).
void ConnectionWatch::scan() {
  std::lock_guard whole_scan(scanning_);
  std::map<std::string, int> open;  // peer -> socket
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (const dirent* entry = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0') continue;
      const std::string peer = accepted_peer(int(fd), port_);
      if (!peer.empty()) open[peer] = int(fd);
    }
    closedir(dir);
  }
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  for (auto& [peer, c] : connections_) c.seen = false;
  for (const auto& [peer, fd] : open) {
    auto [at, added] = connections_.try_emplace(peer);
    Connection& c = at->second;
    if (added || c.socket != fd) c = Connection{fd, now + request_deadline_, false, true};
    c.seen = true;
    if (!c.busy && now > c.deadline && accepted_peer(fd, port_) == peer) {
      ::shutdown(fd, SHUT_RDWR);
      c.deadline = std::chrono::steady_clock::time_point::max();  // once
    }
  }
  std::erase_if(connections_, [](const auto& entry) { return !entry.second.seen; });
}

}  // namespace g4::serve
