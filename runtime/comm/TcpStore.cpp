#include "runtime/comm/TcpStore.h"

#include <arpa/inet.h>
#include <gloo/common/error.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "support/Error.h"

namespace dgemma {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3 };

// A key or value larger than this is no rendezvous message: the peer is not a TcpStore.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 30;
constexpr auto kPollInterval = std::chrono::milliseconds(10);

bool sendAll(int socket, const void* data, size_t bytes) {
  const auto* next = static_cast<const char*>(data);
  while (bytes > 0) {
    // MSG_NOSIGNAL: a peer that went away is an error here, not a SIGPIPE that ends the process.
    ssize_t sent = ::send(socket, next, bytes, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    next += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return true;
}

bool receiveAll(int socket, void* data, size_t bytes) {
  auto* next = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t received = ::recv(socket, next, bytes, 0);
    if (received < 0 && errno == EINTR) continue;
    if (received <= 0) return false;
    next += received;
    bytes -= static_cast<size_t>(received);
  }
  return true;
}

template <typename Integer>
void appendInteger(std::vector<char>& out, Integer value) {
  for (size_t i = 0; i < sizeof(Integer); ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename Integer>
bool receiveInteger(int socket, Integer& value) {
  unsigned char bytes[sizeof(Integer)];
  if (!receiveAll(socket, bytes, sizeof bytes)) return false;
  value = 0;
  for (size_t i = 0; i < sizeof(Integer); ++i) value |= static_cast<Integer>(bytes[i]) << (8 * i);
  return true;
}

// A length-prefixed byte string of at most kMaxMessageBytes.
template <typename Length>
bool receiveBytes(int socket, std::vector<char>& out) {
  Length length = 0;
  if (!receiveInteger(socket, length) || length > kMaxMessageBytes) return false;
  out.resize(static_cast<size_t>(length));
  return receiveAll(socket, out.data(), out.size());
}

// Reads and writes on `socket` fail after `timeout` instead of blocking forever on a silent peer.
void setSocketTimeout(int socket, std::chrono::milliseconds timeout) {
  timeval limit{};
  limit.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  limit.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
}

// One attempt to connect to host:port; -1 when nothing accepts there (yet).
int connectOnce(const std::string& host, int port, std::string& problem) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(port);
  int status = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &addresses);
  if (status != 0) {
    problem = std::string("cannot resolve the host: ") + ::gai_strerror(status);
    return -1;
  }
  int connected = -1;
  for (addrinfo* address = addresses; address && connected < 0; address = address->ai_next) {
    int candidate = ::socket(address->ai_family, address->ai_socktype, address->ai_protocol);
    if (candidate < 0) continue;
    if (::connect(candidate, address->ai_addr, address->ai_addrlen) == 0) {
      connected = candidate;
    } else {
      problem = std::strerror(errno);
      ::close(candidate);
    }
  }
  ::freeaddrinfo(addresses);
  return connected;
}

}  // namespace

TcpStoreServer::TcpStoreServer(int port, int64_t clients, std::chrono::milliseconds timeout)
    : clients_(clients), timeout_(timeout) {
  listener_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  bool ipv6 = listener_ >= 0;
  if (!ipv6) listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener_ < 0) throw RuntimeError(std::string("tcp store: cannot create a socket: ") + std::strerror(errno));
  int on = 1, off = 0;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int bound;
  if (ipv6) {
    ::setsockopt(listener_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);  // IPv4 clients too
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(port));
    bound = ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address);
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    bound = ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address);
  }
  if (bound != 0 || ::listen(listener_, 128) != 0) {
    std::string reason = std::strerror(errno);
    ::close(listener_);
    throw RuntimeError("tcp store: cannot listen on port " + std::to_string(port) + " (MASTER_PORT): " + reason);
  }
  sockaddr_storage actual{};
  socklen_t length = sizeof actual;
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&actual), &length);
  port_ = ntohs(actual.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&actual)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&actual)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (finishedClients_.load() < clients_ && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(kPollInterval);
  stopping_ = true;
  thread_.join();
  ::close(listener_);
}

void TcpStoreServer::serve() {
  std::vector<pollfd> watched = {{listener_, POLLIN, 0}};
  while (!stopping_) {
    if (::poll(watched.data(), watched.size(), static_cast<int>(kPollInterval.count())) <= 0) continue;
    for (size_t i = watched.size(); i-- > 1;) {
      if (watched[i].revents == 0) continue;
      if ((watched[i].revents & POLLIN) && answer(watched[i].fd)) continue;
      ::close(watched[i].fd);  // the client finished (or broke the protocol)
      watched.erase(watched.begin() + static_cast<std::ptrdiff_t>(i));
      ++finishedClients_;
    }
    if (watched[0].revents & POLLIN) {
      int client = ::accept(listener_, nullptr, nullptr);
      if (client >= 0) {
        setSocketTimeout(client, timeout_);  // a half-sent request does not stall the server for good
        watched.push_back({client, POLLIN, 0});
      }
    }
  }
  for (size_t i = 1; i < watched.size(); ++i) ::close(watched[i].fd);
}

bool TcpStoreServer::answer(int client) {
  uint8_t op = 0;
  std::vector<char> key;
  if (!receiveInteger(client, op) || !receiveBytes<uint32_t>(client, key)) return false;
  const std::string name(key.begin(), key.end());
  if (op == kSet) {
    std::vector<char> value;
    if (!receiveBytes<uint64_t>(client, value)) return false;
    values_[name] = std::move(value);
    const uint8_t done = 1;
    return sendAll(client, &done, 1);
  }
  auto found = values_.find(name);
  const uint8_t present = found != values_.end();
  if (op == kCheck) return sendAll(client, &present, 1);
  if (op != kGet) return false;
  std::vector<char> reply = {static_cast<char>(present)};
  if (present) {
    appendInteger<uint64_t>(reply, found->second.size());
    reply.insert(reply.end(), found->second.begin(), found->second.end());
  }
  return sendAll(client, reply.data(), reply.size());
}

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : address_(host + ":" + std::to_string(port)), timeout_(timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string problem;
  while ((socket_ = connectOnce(host, port, problem)) < 0) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw RuntimeError("tcp store " + address_ + " (MASTER_ADDR:MASTER_PORT): no server after " +
                         std::to_string(timeout.count()) + " ms: " + problem);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int on = 1;
  ::setsockopt(socket_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  setSocketTimeout(socket_, timeout);
}

TcpStore::~TcpStore() { ::close(socket_); }

void TcpStore::sendRequest(uint8_t op, const std::string& key) {
  std::vector<char> request = {static_cast<char>(op)};
  appendInteger<uint32_t>(request, static_cast<uint32_t>(key.size()));
  request.insert(request.end(), key.begin(), key.end());
  if (!sendAll(socket_, request.data(), request.size()))
    throw gloo::IoException("tcp store " + address_ + ": the server went away");
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<char> request = {static_cast<char>(kSet)};
  appendInteger<uint32_t>(request, static_cast<uint32_t>(key.size()));
  request.insert(request.end(), key.begin(), key.end());
  appendInteger<uint64_t>(request, data.size());
  request.insert(request.end(), data.begin(), data.end());
  uint8_t done = 0;
  if (!sendAll(socket_, request.data(), request.size()) || !receiveInteger(socket_, done) || done != 1)
    throw gloo::IoException("tcp store " + address_ + ": set \"" + key + "\": the server went away");
}

bool TcpStore::has(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  sendRequest(kCheck, key);
  uint8_t present = 0;
  if (!receiveInteger(socket_, present))
    throw gloo::IoException("tcp store " + address_ + ": check \"" + key + "\": the server went away");
  return present != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys)
    while (!has(key)) {
      if (std::chrono::steady_clock::now() >= deadline)
        throw gloo::IoException("tcp store " + address_ + ": key \"" + key + "\" did not appear within " +
                                std::to_string(timeout.count()) + " ms (is every rank running?)");
      std::this_thread::sleep_for(kPollInterval);
    }
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lock(mutex_);
  sendRequest(kGet, key);
  uint8_t present = 0;
  std::vector<char> value;
  if (!receiveInteger(socket_, present) || !present || !receiveBytes<uint64_t>(socket_, value))
    throw gloo::IoException("tcp store " + address_ + ": get \"" + key + "\": the server went away");
  return value;
}

}  // namespace dgemma
