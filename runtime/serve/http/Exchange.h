// One request's response channel (dgemma-serve's HTTP layer). The handler receives it
// on the io thread and may keep it to answer later from any thread, exactly once: respond(), or
// startStream() + writeChunk()* + endStream(). The calls only queue work for the io thread, which
// performs the socket writes, so a generation thread never blocks on a slow client.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/serve/http/HttpMessage.h"

namespace dgemma::serve {

namespace detail {
class Connection;
struct IoLink;
}  // namespace detail

class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  // An exchange dropped by all its holders before its response is complete is answered with 500, or
  // its stream is cut short by closing the connection.
  ~Exchange();

  const HttpRequest& request() const { return request_; }

  // Answers with a complete response (Content-Length framing). Throws std::logic_error when the
  // exchange was already answered.
  void respond(HttpResponse response);

  // Starts a chunked (Transfer-Encoding: chunked) response with these headers; for contentType
  // "text/event-stream" Cache-Control: no-cache is added. An HTTP/1.0 client gets the bytes unframed,
  // ended by closing the connection.
  void startStream(int status, std::string contentType, std::vector<std::pair<std::string, std::string>> headers = {});

  // Queues one chunk; returns false (and drops it) once the client is gone. A client that lets more
  // than the server's maxQueuedStreamBytes pile up unread counts as gone, so memory stays bounded.
  bool writeChunk(std::string data);

  void endStream();

  bool clientGone() const { return clientGone_.load(); }

  // `callback` runs once, on the io thread, when the connection closes before the response is
  // complete (client disconnected, or reset; a client that shuts down its sending side while waiting
  // counts as disconnected, as HTTP clients do not half-close). If it is already gone, it runs as soon as the io thread
  // gets to it; when the server no longer exists, at once on the calling thread.
  void onClientGone(std::function<void()> callback);

 private:
  friend class detail::Connection;
  enum class Phase { awaitingResponse, streaming, complete };

  Exchange(HttpRequest request, std::shared_ptr<detail::IoLink> link, std::weak_ptr<detail::Connection> connection,
           size_t maxQueuedBytes);

  // Moves from `expected` to `next`; std::logic_error naming `call` when the exchange is elsewhere.
  void advance(Phase expected, Phase next, const char* call);
  // Runs `work` on the io thread with the connection; false when the connection or the server is gone.
  bool post(std::function<void(detail::Connection&)> work);

  // Called by the connection, on the io thread.
  void connectionClosedEarly();
  void chunkWritten(size_t bytes) { queuedBytes_ -= bytes; }
  void responseWritten();
  bool unanswered();

  HttpRequest request_;
  std::shared_ptr<detail::IoLink> link_;
  std::weak_ptr<detail::Connection> connection_;
  const size_t maxQueuedBytes_;

  std::mutex phaseMutex_;
  Phase phase_ = Phase::awaitingResponse;
  std::atomic<bool> clientGone_{false};
  std::atomic<size_t> queuedBytes_{0};

  // io thread only
  std::function<void()> goneCallback_;
  bool connectionClosed_ = false;
  bool responseWritten_ = false;
};

}  // namespace dgemma::serve
