// A key-value store over TCP for Gloo's rendezvous when the ranks run on several hosts. Debian's
// Gloo ships a FileStore, a HashStore and a RedisStore but no TCP store, so this is a small one:
// rank 0 serves it at MASTER_ADDR:MASTER_PORT (TcpStoreServer) and every rank, rank 0 included,
// is a client (TcpStore). Keys are written once and read many times, which is all Gloo's
// connectFullMesh needs; a reader waits for a key by asking again until it appears.
//
// Wire format, little-endian: a request is an op byte, a u32 key length and the key; a set adds a
// u64 value length and the value. The server answers a set with one byte (1), a get with a found
// byte and, when found, a u64 length and the value, a check with a found byte.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dgemma {

class TcpStoreServer {
 public:
  // Listens on every interface at `port` (0: a free port, see port()). `clients` is how many
  // clients the destructor waits for. Throws RuntimeError naming the port when it cannot bind.
  TcpStoreServer(int port, int64_t clients, std::chrono::milliseconds timeout);
  // Waits until `clients` clients have connected and disconnected again, at most the timeout, so
  // that no rank loses the store halfway through its rendezvous; then stops serving.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();
  // Answers one request of `client`; false when the client has gone or sent nonsense.
  bool answer(int client);

  int listener_ = -1;
  int port_ = 0;
  int64_t clients_;
  std::chrono::milliseconds timeout_;
  std::atomic<int64_t> finishedClients_{0};
  std::atomic<bool> stopping_{false};
  std::map<std::string, std::vector<char>> values_;  // touched by the serving thread only
  std::thread thread_;
};

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Connects to the server at host:port, retrying until `timeout` (the server may start later).
  // Throws RuntimeError naming the address when it cannot.
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits (up to the store's timeout) for the key, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // Throws gloo::IoException naming the first missing key when the keys do not all appear in time.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  bool has(const std::string& key);
  void sendRequest(uint8_t op, const std::string& key);

  std::string address_;  // "host:port", for messages
  int socket_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one request at a time on the socket
};

}  // namespace dgemma
