// g4 serve's ConnectionWatch on its own (docs/DESIGN.md §8): a connection whose handler has its
// whole request is never closed for the request deadline, however its arrival falls between the
// watch's scans of the process's sockets; an idle one is closed once the deadline passes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "serve/connections.h"

namespace g4 {
namespace {

using std::chrono::milliseconds;

// A listening loopback socket on a free port; its port; connections to it, accepted.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(0);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 512), 0);
    socklen_t length = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &length);
    port_ = ntohs(a.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

  // A client socket connected to the listener and the server's end of it, with the client's port.
  struct Pair {
    int client = -1, server = -1, client_port = -1;
  };
  Pair connect_one() const {
    Pair p;
    p.client = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port_);
    if (connect(p.client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return p;
    sockaddr_in mine{};
    socklen_t length = sizeof mine;
    getsockname(p.client, reinterpret_cast<sockaddr*>(&mine), &length);
    p.client_port = ntohs(mine.sin_port);
    p.server = accept(fd_, nullptr, nullptr);
    return p;
  }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }
  int fd_ = -1, port_ = 0;
};

// Whether the server's end of `client` was shut down (the client reads the end).
bool shut_by_server(int client) {
  pollfd p{client, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char byte = 0;
  return recv(client, &byte, 1, MSG_DONTWAIT) <= 0;
}

// The calling thread and the threads it starts run on one CPU (as on a loaded machine, where a
// scan is preempted between listing the sockets and updating its table) until destroyed.
class OneCpu {
 public:
  OneCpu() {
    sched_getaffinity(0, sizeof before_, &before_);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &before_)) {
        CPU_SET(cpu, &one);
        break;
      }
    sched_setaffinity(0, sizeof one, &one);
  }
  ~OneCpu() { sched_setaffinity(0, sizeof before_, &before_); }

 private:
  cpu_set_t before_;
};

// Connections arrive while the watch scans without pause, on one CPU (scans preempted between
// listing the sockets and updating the table: without scans in turn, one that listed the sockets
// before an arrival ended after the arrival's begin_request and dropped it): each handler calls
// begin_request at once and stays busy past three deadlines; none is closed, and each is closed
// one deadline after its end_request.
TEST(ConnectionWatch, ABusyConnectionOutlivesTheDeadlineWhateverTheScansSaw) {
  constexpr int kConnections = 300;  // 600 descriptors: within a default limit of 1 024
  constexpr milliseconds kDeadline{300};
  const OneCpu one_cpu;
  Listener listener;
  serve::ConnectionWatch watch(listener.port(), kDeadline, milliseconds(0));
  std::vector<Listener::Pair> pairs;
  int unknown = 0;
  for (int i = 0; i < kConnections; ++i) {
    const Listener::Pair p = listener.connect_one();
    ASSERT_GE(p.server, 0) << "connection " << i;
    unknown += watch.begin_request("127.0.0.1", p.client_port) < 0;
    pairs.push_back(p);
  }
  EXPECT_EQ(unknown, 0) << "begin_request did not find connections that were open";
  std::this_thread::sleep_for(3 * kDeadline);
  int shut = 0;
  for (const Listener::Pair& p : pairs) shut += shut_by_server(p.client);
  EXPECT_EQ(shut, 0) << "busy connections were closed for the request deadline";

  for (const Listener::Pair& p : pairs) watch.end_request("127.0.0.1", p.client_port);
  std::this_thread::sleep_for(kDeadline + milliseconds(500));
  shut = 0;
  for (const Listener::Pair& p : pairs) shut += shut_by_server(p.client);
  EXPECT_EQ(shut, kConnections) << "idle connections stayed open past the request deadline";
  for (const Listener::Pair& p : pairs) {
    close(p.client);
    close(p.server);
  }
}

}  // namespace
}  // namespace g4
