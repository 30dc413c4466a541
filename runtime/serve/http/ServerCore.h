// The HTTP server's state on the io thread (internal to runtime/serve/http): the listening socket,
// the open connections, and the drain that stops them.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "runtime/serve/http/Connection.h"
#include "runtime/serve/http/HttpServer.h"

namespace dgemma::serve::detail {

class ServerCore {
 public:
  ServerCore(HttpServerOptions options, Handler handler);
  ~ServerCore();

  void beginDrain(double drainSeconds);  // io thread
  void drainOnSignals(double drainSeconds);
  void connectionClosed(Connection* connection);  // io thread
  std::string errorBody(int status, const std::string& message) const;
  bool draining() const { return draining_; }

  // Declared first: destroyed last, after every socket and timer that uses it.
  boost::asio::io_context io;
  const HttpServerOptions options;
  const Handler handler;
  const std::shared_ptr<IoLink> link;
  int boundPort = 0;
  std::atomic<size_t> openConnections{0};
  std::atomic<uint64_t> refusedConnections{0};

 private:
  void acceptNext();
  void onAccepted(boost::system::error_code error, boost::asio::ip::tcp::socket socket);
  void stop();

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer acceptRetry_;
  boost::asio::steady_timer drainDeadline_;
  std::optional<boost::asio::signal_set> signals_;
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections_;
  bool draining_ = false;
};

}  // namespace dgemma::serve::detail
