// One accepted TCP connection of the HTTP server (internal to runtime/serve/http). Everything here
// runs on the io thread. A connection reads requests one at a time, hands each to the handler as an
// Exchange, writes the response the exchange queues, and then waits for the next request (keep-alive)
// or closes. While a response is pending it keeps reading, so that a client that disconnects is
// noticed (EOF) even when nothing is being written to it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/serve/http/Exchange.h"
#include "runtime/serve/http/HttpMessage.h"

namespace dgemma::serve::detail {

class ServerCore;

// Lets exchanges held by other threads queue work on the io thread, and learn when the server (and
// its io_context) no longer exists, instead of posting to a destroyed io_context.
struct IoLink {
  explicit IoLink(boost::asio::io_context& io) : io(&io) {}
  bool post(std::function<void()> work);  // false once detached
  void detach();

  std::mutex mutex;
  boost::asio::io_context* io;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore& server, boost::asio::ip::tcp::socket socket);

  void start();
  // The server started draining: an idle connection closes now; others finish their exchange first.
  void drain();
  // Closes the socket at once; an exchange in progress learns that its client is gone.
  void closeNow();

  // The exchange's calls, run on the io thread; ignored unless `exchange` is this connection's current one.
  void sendResponse(const Exchange* exchange, const HttpResponse& response);
  void startStream(const Exchange* exchange, int status, const std::string& contentType, const HeaderList& headers);
  void sendChunk(const Exchange* exchange, std::string data);
  void endStream(const Exchange* exchange);
  // Every holder dropped `exchange` before completing its response.
  void exchangeAbandoned(const Exchange* exchange);

 private:
  enum class State {
    awaitingRequest,  // idle keep-alive: no byte of the next request yet (idle timeout)
    readingRequest,   // a request's header and body are arriving (request timeout)
    handling,         // the handler has the exchange; its response is being written
    closing,          // the last response is written or being written; input is discarded
    closed,
  };
  enum class Framing { contentLength, chunked, untilClose };

  void readSome();
  void onRead(boost::system::error_code error, size_t bytes);
  void parseInput();
  bool acceptHeader();  // false when the request was answered with an error instead
  void dispatch();
  void answerError(int status, const std::string& message);
  void answerParseError(boost::system::error_code error);
  std::string responseHead(int status, const std::string& contentType, const HeaderList& headers, Framing framing,
                           size_t contentLength);
  bool isCurrent(const Exchange* exchange) const;
  void queueWrite(std::string bytes, size_t streamBytes);
  void writeNext();
  void onWritten(boost::system::error_code error);
  void finishResponse();
  void startNextRequest();
  void lingerThenClose();
  void armTimer(double seconds);
  void cancelTimer();
  void onTimer();

  ServerCore& server_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  uint64_t timerGeneration_ = 0;
  State state_ = State::awaitingRequest;

  boost::beast::flat_buffer input_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  bool headerAccepted_ = false;
  bool reading_ = false;
  bool inputEnded_ = false;  // the peer closed its side, or reading failed

  struct PendingWrite {
    std::string bytes;
    size_t streamBytes;  // payload of a stream chunk, released from the exchange's queue count once written
  };
  std::deque<PendingWrite> writes_;
  bool writing_ = false;
  bool responseComplete_ = false;  // the last piece of the current response is queued
  bool keepAlive_ = true;
  bool http10_ = false;
  bool headRequest_ = false;  // the response carries the body's headers but not the body
  Framing streamFraming_ = Framing::chunked;
  // The exchange being answered. Held weakly, so that an exchange its holders drop unanswered is
  // destroyed, and its destructor tells the connection (exchangeAbandoned) instead of leaving the client waiting.
  std::weak_ptr<Exchange> exchange_;
  const Exchange* currentExchange_ = nullptr;
  bool responseStarted_ = false;
};

}  // namespace dgemma::serve::detail
