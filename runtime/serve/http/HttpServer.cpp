#include "runtime/serve/http/HttpServer.h"

#include <boost/asio/post.hpp>

#include "runtime/serve/http/ServerCore.h"

namespace dgemma::serve {

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : core_(std::make_unique<detail::ServerCore>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() = default;

int HttpServer::boundPort() const { return core_->boundPort; }

void HttpServer::run() { core_->io.run(); }

void HttpServer::drain(double drainSeconds) {
  boost::asio::post(core_->io, [core = core_.get(), drainSeconds] { core->beginDrain(drainSeconds); });
}

void HttpServer::drainOnSignals(double drainSeconds) { core_->drainOnSignals(drainSeconds); }

size_t HttpServer::openConnections() const { return core_->openConnections.load(); }

uint64_t HttpServer::refusedConnections() const { return core_->refusedConnections.load(); }

}  // namespace dgemma::serve
