#include "runtime/serve/http/ServerCore.h"

#include <sys/resource.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/socket_base.hpp>

#include <chrono>
#include <csignal>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/Error.h"

namespace dgemma::serve::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

// Each connection is a file descriptor: the default soft limit (often 1024) would cap the server
// below its maxConnections.
void raiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

void checkOptions(const HttpServerOptions& options) {
  auto positive = [](double value, const char* field) {
    if (!(value > 0))
      throw InputError(std::string("HTTP server option ") + field + ": expected a positive number, got " +
                       std::to_string(value));
  };
  if (options.port < 0 || options.port > 65535) {
    throw InputError("HTTP server option port: expected 0 to 65535, got " + std::to_string(options.port));
  }
  positive(options.maxConnections, "maxConnections");
  positive(options.idleTimeoutSeconds, "idleTimeoutSeconds");
  positive(options.requestTimeoutSeconds, "requestTimeoutSeconds");
  positive(static_cast<double>(options.maxHeaderBytes), "maxHeaderBytes");
  positive(static_cast<double>(options.maxQueuedStreamBytes), "maxQueuedStreamBytes");
}

std::chrono::steady_clock::duration seconds(double value) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(value));
}

}  // namespace

ServerCore::ServerCore(HttpServerOptions options_, Handler handler_)
    : options(std::move(options_)),
      handler(std::move(handler_)),
      link(std::make_shared<IoLink>(io)),
      acceptor_(io),
      acceptRetry_(io),
      drainDeadline_(io) {
  checkOptions(options);
  raiseOpenFileLimit();
  std::string where = options.host + ":" + std::to_string(options.port);
  error_code error;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(options.host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, error);
  if (error || endpoints.empty()) throw InputError(where + ": cannot resolve the host: " + error.message());
  tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor_.open(endpoint.protocol(), error);
  if (!error) acceptor_.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) acceptor_.bind(endpoint, error);
  if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
  if (error) throw InputError(where + ": cannot listen: " + error.message());
  boundPort = acceptor_.local_endpoint().port();
  acceptNext();
}

ServerCore::~ServerCore() {
  link->detach();
  // Connections refer to this object; close them while it is whole.
  auto connections = connections_;
  for (auto& [raw, connection] : connections) connection->closeNow();
}

std::string ServerCore::errorBody(int status, const std::string& message) const {
  if (options.errorBody) return options.errorBody(status, message);
  return nlohmann::json{{"error", {{"message", message}}}}.dump();
}

void ServerCore::acceptNext() {
  acceptor_.async_accept([this](error_code error, tcp::socket socket) { onAccepted(error, std::move(socket)); });
}

void ServerCore::onAccepted(error_code error, tcp::socket socket) {
  if (!acceptor_.is_open() || error == asio::error::operation_aborted) return;
  if (error) {
    // Out of file descriptors, or a connection reset before it was accepted: try again shortly
    // instead of spinning or giving up on accepting.
    acceptRetry_.expires_after(std::chrono::milliseconds(100));
    acceptRetry_.async_wait([this](error_code waitError) {
      if (!waitError && acceptor_.is_open()) acceptNext();
    });
    return;
  }
  if (connections_.size() >= static_cast<size_t>(options.maxConnections)) {
    ++refusedConnections;
    error_code ignored;
    socket.close(ignored);
  } else {
    auto connection = std::make_shared<Connection>(*this, std::move(socket));
    connections_.emplace(connection.get(), connection);
    ++openConnections;
    connection->start();
  }
  acceptNext();
}

void ServerCore::connectionClosed(Connection* connection) {
  if (connections_.erase(connection) == 0) return;
  --openConnections;
  if (draining_ && connections_.empty()) stop();
}

void ServerCore::beginDrain(double drainSeconds) {
  if (draining_) return;
  draining_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  acceptRetry_.cancel();
  if (signals_) signals_->cancel(ignored);
  std::vector<std::shared_ptr<Connection>> open;
  for (auto& [raw, connection] : connections_) open.push_back(connection);
  for (auto& connection : open) connection->drain();
  if (connections_.empty()) {
    stop();
    return;
  }
  drainDeadline_.expires_after(seconds(drainSeconds));
  drainDeadline_.async_wait([this](error_code error) {
    if (error) return;
    std::vector<std::shared_ptr<Connection>> remaining;
    for (auto& [raw, connection] : connections_) remaining.push_back(connection);
    for (auto& connection : remaining) connection->closeNow();
    stop();
  });
}

void ServerCore::drainOnSignals(double drainSeconds) {
  signals_.emplace(io, SIGINT, SIGTERM);
  signals_->async_wait([this, drainSeconds](error_code error, int) {
    if (!error) beginDrain(drainSeconds);
  });
}

void ServerCore::stop() {
  drainDeadline_.cancel();
  io.stop();
}

}  // namespace dgemma::serve::detail
