#include "runtime/serve/http/Exchange.h"

#include <stdexcept>

#include "runtime/serve/http/Connection.h"

namespace dgemma::serve {

Exchange::Exchange(HttpRequest request, std::shared_ptr<detail::IoLink> link,
                   std::weak_ptr<detail::Connection> connection, size_t maxQueuedBytes)
    : request_(std::move(request)),
      link_(std::move(link)),
      connection_(std::move(connection)),
      maxQueuedBytes_(maxQueuedBytes) {}

Exchange::~Exchange() {
  if (phase_ == Phase::complete || clientGone_) return;
  link_->post([connection = connection_, self = static_cast<const Exchange*>(this)] {
    if (std::shared_ptr<detail::Connection> open = connection.lock()) open->exchangeAbandoned(self);
  });
}

void Exchange::advance(Phase expected, Phase next, const char* call) {
  std::lock_guard lock(phaseMutex_);
  if (phase_ != expected) {
    const char* where = phase_ == Phase::awaitingResponse ? "before startStream()"
                        : phase_ == Phase::streaming      ? "while a stream is open"
                                                          : "after the response was complete";
    throw std::logic_error(std::string("Exchange::") + call + " called " + where + " (" + request_.method + " " +
                           request_.path + ")");
  }
  phase_ = next;
}

bool Exchange::post(std::function<void(detail::Connection&)> work) {
  std::shared_ptr<detail::Connection> connection = connection_.lock();
  if (!connection) return false;
  return link_->post([connection, work = std::move(work)] { work(*connection); });
}

void Exchange::respond(HttpResponse response) {
  advance(Phase::awaitingResponse, Phase::complete, "respond()");
  if (clientGone_) return;
  post([self = shared_from_this(), response = std::move(response)](detail::Connection& connection) {
    connection.sendResponse(self.get(), response);
  });
}

void Exchange::startStream(int status, std::string contentType,
                           std::vector<std::pair<std::string, std::string>> headers) {
  advance(Phase::awaitingResponse, Phase::streaming, "startStream()");
  if (clientGone_) return;
  post([self = shared_from_this(), status, contentType = std::move(contentType), headers = std::move(headers)](
           detail::Connection& connection) { connection.startStream(self.get(), status, contentType, headers); });
}

bool Exchange::writeChunk(std::string data) {
  {
    std::lock_guard lock(phaseMutex_);
    if (phase_ != Phase::streaming) {
      throw std::logic_error("Exchange::writeChunk() called outside a stream (" + request_.method + " " +
                             request_.path + ")");
    }
  }
  if (clientGone_) return false;
  // An empty chunk would end the chunked body; there is nothing to send anyway.
  if (data.empty()) return true;
  if (queuedBytes_.fetch_add(data.size()) + data.size() > maxQueuedBytes_) {
    // The client reads slower than the stream is produced: give up on it rather than buffer without bound.
    clientGone_ = true;
    post([](detail::Connection& connection) { connection.closeNow(); });
    return false;
  }
  bool queued = post([self = shared_from_this(), data = std::move(data)](detail::Connection& connection) mutable {
    connection.sendChunk(self.get(), std::move(data));
  });
  if (!queued) clientGone_ = true;
  return queued;
}

void Exchange::endStream() {
  advance(Phase::streaming, Phase::complete, "endStream()");
  if (clientGone_) return;
  post([self = shared_from_this()](detail::Connection& connection) { connection.endStream(self.get()); });
}

void Exchange::onClientGone(std::function<void()> callback) {
  auto shared = std::make_shared<std::function<void()>>(std::move(callback));
  bool posted = link_->post([self = shared_from_this(), shared] {
    if (self->connectionClosed_) {
      (*shared)();
    } else if (!self->responseWritten_) {
      self->goneCallback_ = std::move(*shared);
    }
  });
  if (!posted) {
    clientGone_ = true;
    (*shared)();
  }
}

void Exchange::connectionClosedEarly() {
  clientGone_ = true;
  connectionClosed_ = true;
  if (goneCallback_) {
    std::function<void()> callback = std::move(goneCallback_);
    goneCallback_ = nullptr;
    callback();
  }
}

void Exchange::responseWritten() {
  responseWritten_ = true;
  // The callback may hold this exchange; dropping it breaks that cycle.
  goneCallback_ = nullptr;
}

bool Exchange::unanswered() {
  std::lock_guard lock(phaseMutex_);
  return phase_ == Phase::awaitingResponse;
}

}  // namespace dgemma::serve
