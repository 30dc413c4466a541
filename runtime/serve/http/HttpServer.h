// dgemma-serve's HTTP/1.1 server: keep-alive, chunked streaming (SSE), Expect: 100-continue, limits on
// header and body size, idle and request timeouts, and a graceful drain on shutdown.
//
// Why Boost.Beast on Boost.Asio: an asynchronous server on one io thread holds thousands of idle
// keep-alive connections with timers, without a thread per connection. A thread-pool server (such as
// cpp-httplib) blocks one worker per idle connection until its read timeout, so 1,000 idle connections
// would stall it. Beast contributes only the request parser; the responses are framed here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/serve/http/Exchange.h"
#include "runtime/serve/http/HttpMessage.h"

namespace dgemma::serve {

namespace detail {
class ServerCore;
}

// Called on the io thread for every request (unknown paths included); must not block.
using Handler = std::function<void(std::shared_ptr<Exchange>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                      // 0: an ephemeral port (boundPort() tells which)
  size_t maxBodyBytes =
      32 << 20;    // larger: 413 before the body is read (Content-Length, or chunked body passing the limit)
  size_t maxHeaderBytes = 64 << 10;  // larger: 431
  int maxConnections = 4096;         // beyond: accepted and closed at once (counted)
  double idleTimeoutSeconds = 30;    // a keep-alive connection idle this long (no request bytes) is closed
  double requestTimeoutSeconds = 60; // a request's header+body must arrive within this (else 408)
  size_t maxQueuedStreamBytes = 8 << 20;  // a stream's unwritten bytes beyond this: the client counts as gone
  // The body of an error the HTTP layer itself answers (400 malformed, 408, 413, 431, 500 when the
  // handler throws, 503 while draining): the API layer passes a formatter producing OpenAI's error JSON.
  // Default: a small JSON {"error":{"message":...}}.
  std::function<std::string(int status, const std::string& message)> errorBody;
};

class HttpServer {
 public:
  // Binds and listens (InputError naming host:port when it cannot), and raises the process's
  // RLIMIT_NOFILE soft limit to the hard limit so that thousands of connections fit.
  HttpServer(HttpServerOptions options, Handler handler);
  // Call it after run() has returned (or when run() was never called).
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int boundPort() const;

  // Runs the io loop on the calling thread until the server has stopped.
  void run();

  // Thread-safe and async-signal-unsafe (call it from a normal thread or an asio signal handler):
  // stops accepting, answers requests arriving on existing connections with 503 + Connection: close,
  // closes idle connections, lets exchanges in progress finish (streams included) for up to
  // `drainSeconds`, then closes everything and makes run() return.
  void drain(double drainSeconds);

  // When called before run(), SIGTERM and SIGINT start drain(drainSeconds) (through asio::signal_set).
  void drainOnSignals(double drainSeconds);

  size_t openConnections() const;  // for /metrics
  uint64_t refusedConnections() const;

 private:
  std::unique_ptr<detail::ServerCore> core_;
};

}  // namespace dgemma::serve
