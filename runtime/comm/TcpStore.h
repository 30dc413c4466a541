// A key-value store over TCP for Gloo's rendezvous and the NCCL unique id when the ranks are
// started by torchrun, Slurm or mpirun. It speaks PyTorch's c10d TCPStore wire protocol, so one
// client serves both cases:
//  - under torchrun the elastic agent already serves a c10d TCPStore at MASTER_ADDR:MASTER_PORT
//    (TORCHELASTIC_USE_AGENT_STORE=True) and every rank is only a client (TcpStore);
//  - under Slurm or mpirun, or torchrun without its agent's store, rank 0 serves one itself
//    (TcpStoreServer) and every rank, rank 0 included, is a client.
// Debian's Gloo ships a FileStore, a HashStore and a RedisStore but no TCP store.
//
// The protocol (docs/parallelism.md, "The TCP store"), native little-endian: a client opens with
// VALIDATE (op 0) and the u32 magic 0x3C85F7CE, which the server does not answer. A key is a u64
// length and its bytes, a value likewise. SET (1) key value: no answer. GET (3) key: the value.
// ADD (4) key i64: the new i64 sum. CHECK (5) u64 n, n keys: one byte, 0 when every key is set,
// 1 when not. WAIT (6) u64 n, n keys: one byte 0 once every key is set. GETNUMKEYS (7): i64.
// DELETE_KEY (8) key: i64 keys deleted. CANCEL_WAIT (12): drops the client's waits, answers 1.
// PING (13) u32 nonce: the nonce. A client sends each key of its API as "/" + key, as torch's does.
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
  struct Client {
    bool validated = false;
    std::vector<std::string> awaited;  // a WAIT not answered yet
  };

  void serve();
  // Answers one request of `client`; false when the client has gone or broke the protocol.
  bool answer(int socket, Client& client);
  // Answers every WAIT whose keys are now all set.
  void answerWaiters();
  bool allSet(const std::vector<std::string>& keys) const;

  int listener_ = -1;
  int port_ = 0;
  int64_t clients_;
  std::chrono::milliseconds timeout_;
  std::atomic<int64_t> finishedClients_{0};
  std::atomic<bool> stopping_{false};
  // Touched by the serving thread only.
  std::map<std::string, std::vector<char>> values_;
  std::map<int, Client> connected_;
  std::thread thread_;
};

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Connects to the c10d store at host:port (ours or torch's), retrying until `timeout` (the
  // server may start later), and validates. Throws RuntimeError naming the address when it cannot.
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
  // Adds `amount` to the integer the key holds (0 when unset); returns the sum.
  int64_t add(const std::string& key, int64_t amount);

 private:
  bool has(const std::string& key);
  void send(const std::vector<char>& request, const std::string& what);
  void receive(void* data, size_t bytes, const std::string& what);

  std::string address_;  // "host:port", for messages
  int socket_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one request at a time on the socket
};

}  // namespace dgemma
