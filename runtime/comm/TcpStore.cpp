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

// c10d's QueryType values (the protocol's op byte) and its answers.
enum Op : uint8_t {
  kValidate = 0,
  kSet = 1,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kCancelWait = 12,
  kPing = 13,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0, kNotReady = 1;          // CHECK
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WAIT, CANCEL_WAIT
// c10d's client puts every key of its API under "/" on the wire; so does ours, so that a key means
// the same to a torch client and to a dgemma one.
const std::string kKeyPrefix = "/";

// A key or value larger than this, or more keys than this, is no rendezvous message: the peer is
// not a c10d store client.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxKeys = 1 << 16;
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

// The protocol's integers are the hosts' native ones; every host dgemma runs on is little-endian.
template <typename Integer>
void appendInteger(std::vector<char>& out, Integer value) {
  for (size_t i = 0; i < sizeof(Integer); ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
}

template <typename Integer>
bool receiveInteger(int socket, Integer& value) {
  unsigned char bytes[sizeof(Integer)];
  if (!receiveAll(socket, bytes, sizeof bytes)) return false;
  uint64_t assembled = 0;
  for (size_t i = 0; i < sizeof(Integer); ++i) assembled |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  value = static_cast<Integer>(assembled);
  return true;
}

void appendBytes(std::vector<char>& out, const void* data, size_t bytes) {
  appendInteger<uint64_t>(out, bytes);
  const auto* begin = static_cast<const char*>(data);
  out.insert(out.end(), begin, begin + bytes);
}

// A key of the client's API as the wire carries it.
void appendKey(std::vector<char>& out, const std::string& key) {
  const std::string wire = kKeyPrefix + key;
  appendBytes(out, wire.data(), wire.size());
}

// A u64-length-prefixed byte string of at most kMaxMessageBytes.
bool receiveBytes(int socket, std::vector<char>& out) {
  uint64_t length = 0;
  if (!receiveInteger(socket, length) || length > kMaxMessageBytes) return false;
  out.resize(static_cast<size_t>(length));
  return receiveAll(socket, out.data(), out.size());
}

bool receiveKey(int socket, std::string& key) {
  std::vector<char> bytes;
  if (!receiveBytes(socket, bytes)) return false;
  key.assign(bytes.begin(), bytes.end());
  return true;
}

bool receiveKeys(int socket, std::vector<std::string>& keys) {
  uint64_t count = 0;
  if (!receiveInteger(socket, count) || count > kMaxKeys) return false;
  keys.resize(static_cast<size_t>(count));
  for (std::string& key : keys)
    if (!receiveKey(socket, key)) return false;
  return true;
}

// c10d keeps ADD's counters as decimal text; anything else counts as 0.
int64_t counterValue(const std::vector<char>& text) {
  const std::string digits(text.begin(), text.end());
  try {
    size_t used = 0;
    const long long value = std::stoll(digits, &used);
    return used == digits.size() ? value : 0;
  } catch (const std::exception&) {
    return 0;
  }
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
  std::vector<pollfd> watched;
  while (!stopping_) {
    watched.assign(1, {listener_, POLLIN, 0});
    for (const auto& [socket, client] : connected_) watched.push_back({socket, POLLIN, 0});
    if (::poll(watched.data(), watched.size(), static_cast<int>(kPollInterval.count())) <= 0) continue;
    for (size_t i = 1; i < watched.size(); ++i) {
      if (watched[i].revents == 0) continue;
      const int socket = watched[i].fd;
      if ((watched[i].revents & POLLIN) && answer(socket, connected_.at(socket))) continue;
      ::close(socket);  // the client finished (or broke the protocol)
      connected_.erase(socket);
      ++finishedClients_;
    }
    answerWaiters();
    if (watched[0].revents & POLLIN) {
      int socket = ::accept(listener_, nullptr, nullptr);
      if (socket >= 0) {
        setSocketTimeout(socket, timeout_);  // a half-sent request does not stall the server for good
        connected_[socket] = Client{};
      }
    }
  }
  for (const auto& [socket, client] : connected_) ::close(socket);
  connected_.clear();
}

bool TcpStoreServer::allSet(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys)
    if (!values_.count(key)) return false;
  return true;
}

void TcpStoreServer::answerWaiters() {
  for (auto& [socket, client] : connected_) {
    if (client.awaited.empty() || !allSet(client.awaited)) continue;
    client.awaited.clear();
    // A client that has gone shows at the next poll.
    sendAll(socket, &kStopWaiting, 1);
  }
}

bool TcpStoreServer::answer(int socket, Client& client) {
  uint8_t op = 0;
  if (!receiveInteger(socket, op)) return false;
  if (!client.validated) {
    uint32_t magic = 0;
    if (op != kValidate || !receiveInteger(socket, magic) || magic != kValidationMagic) return false;
    client.validated = true;
    return true;
  }
  std::vector<char> reply;
  switch (op) {
    case kSet: {
      std::string key;
      std::vector<char> value;
      if (!receiveKey(socket, key) || !receiveBytes(socket, value)) return false;
      values_[key] = std::move(value);
      return true;
    }
    case kGet: {
      std::string key;
      if (!receiveKey(socket, key)) return false;
      auto found = values_.find(key);
      const std::vector<char> none;
      const std::vector<char>& value = found == values_.end() ? none : found->second;
      appendBytes(reply, value.data(), value.size());
      break;
    }
    case kAdd: {
      std::string key;
      int64_t amount = 0;
      if (!receiveKey(socket, key) || !receiveInteger(socket, amount)) return false;
      std::vector<char>& stored = values_[key];
      const int64_t sum = counterValue(stored) + amount;
      const std::string text = std::to_string(sum);
      stored.assign(text.begin(), text.end());
      appendInteger<int64_t>(reply, sum);
      break;
    }
    case kCheck: {
      std::vector<std::string> keys;
      if (!receiveKeys(socket, keys)) return false;
      reply.push_back(static_cast<char>(allSet(keys) ? kReady : kNotReady));
      break;
    }
    case kWait: {
      std::vector<std::string> keys;
      if (!receiveKeys(socket, keys)) return false;
      if (!allSet(keys)) {
        client.awaited = std::move(keys);  // answered by answerWaiters once they are
        return true;
      }
      reply.push_back(static_cast<char>(kStopWaiting));
      break;
    }
    case kGetNumKeys:
      appendInteger<int64_t>(reply, static_cast<int64_t>(values_.size()));
      break;
    case kDeleteKey: {
      std::string key;
      if (!receiveKey(socket, key)) return false;
      appendInteger<int64_t>(reply, static_cast<int64_t>(values_.erase(key)));
      break;
    }
    case kCancelWait:
      client.awaited.clear();
      reply.push_back(static_cast<char>(kWaitCanceled));
      break;
    case kPing: {  // torch's client pings once after VALIDATE and expects its nonce back
      uint32_t nonce = 0;
      if (!receiveInteger(socket, nonce)) return false;
      appendInteger<uint32_t>(reply, nonce);
      break;
    }
    default:
      return false;  // an op this store does not serve
  }
  return sendAll(socket, reply.data(), reply.size());
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
  std::vector<char> validate = {static_cast<char>(kValidate)};
  appendInteger<uint32_t>(validate, kValidationMagic);
  if (!sendAll(socket_, validate.data(), validate.size())) {
    ::close(socket_);
    throw RuntimeError("tcp store " + address_ + " (MASTER_ADDR:MASTER_PORT): the server closed the connection");
  }
}

TcpStore::~TcpStore() { ::close(socket_); }

void TcpStore::send(const std::vector<char>& request, const std::string& what) {
  if (!sendAll(socket_, request.data(), request.size()))
    throw gloo::IoException("tcp store " + address_ + ": " + what + ": the server went away");
}

void TcpStore::receive(void* data, size_t bytes, const std::string& what) {
  if (!receiveAll(socket_, data, bytes))
    throw gloo::IoException("tcp store " + address_ + ": " + what + ": no answer from the server");
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<char> request = {static_cast<char>(kSet)};
  appendKey(request, key);
  appendBytes(request, data.data(), data.size());
  send(request, "set \"" + key + "\"");
}

int64_t TcpStore::add(const std::string& key, int64_t amount) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<char> request = {static_cast<char>(kAdd)};
  appendKey(request, key);
  appendInteger<int64_t>(request, amount);
  const std::string what = "add \"" + key + "\"";
  send(request, what);
  int64_t sum = 0;
  if (!receiveInteger(socket_, sum)) throw gloo::IoException("tcp store " + address_ + ": " + what + ": no answer from the server");
  return sum;
}

bool TcpStore::has(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<char> request = {static_cast<char>(kCheck)};
  appendInteger<uint64_t>(request, 1);
  appendKey(request, key);
  const std::string what = "check \"" + key + "\"";
  send(request, what);
  uint8_t ready = kNotReady;
  receive(&ready, 1, what);
  return ready == kReady;
}

// Polls with CHECK rather than blocking in WAIT: a wait cut short by its timeout then leaves no
// pending request behind on the server.
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
  std::vector<char> request = {static_cast<char>(kGet)};
  appendKey(request, key);
  const std::string what = "get \"" + key + "\"";
  send(request, what);
  std::vector<char> value;
  if (!receiveBytes(socket_, value)) throw gloo::IoException("tcp store " + address_ + ": " + what + ": no answer from the server");
  return value;
}

}  // namespace dgemma
