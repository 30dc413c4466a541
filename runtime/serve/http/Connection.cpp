#include "runtime/serve/http/Connection.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/verb.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>

#include "runtime/serve/http/ServerCore.h"

namespace dgemma::serve::detail {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using boost::system::error_code;

namespace {

constexpr size_t kReadSize = 16 << 10;
// After a response with Connection: close, the rest of the client's input is read and dropped for this
// long, so that the close does not reset the connection before the client has read the response.
constexpr double kLingerSeconds = 1.0;

std::string lowerCased(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) {
           return std::tolower(x) == std::tolower(y);
         });
}

std::string hex(size_t value) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  do {
    text.insert(text.begin(), digits[value % 16]);
    value /= 16;
  } while (value != 0);
  return text;
}

}  // namespace

bool IoLink::post(std::function<void()> work) {
  std::lock_guard lock(mutex);
  if (io == nullptr) return false;
  asio::post(*io, std::move(work));
  return true;
}

void IoLink::detach() {
  std::lock_guard lock(mutex);
  io = nullptr;
}

Connection::Connection(ServerCore& server, asio::ip::tcp::socket socket)
    : server_(server), socket_(std::move(socket)), timer_(socket_.get_executor()) {}

void Connection::start() {
  error_code ignored;
  // Stream chunks are small and must leave at once.
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  startNextRequest();
  readSome();
}

void Connection::drain() {
  if (state_ == State::awaitingRequest) closeNow();
}

void Connection::closeNow() {
  if (state_ == State::closed) return;
  auto self = shared_from_this();  // the server's reference goes below
  state_ = State::closed;
  cancelTimer();
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  writes_.clear();
  if (std::shared_ptr<Exchange> exchange = exchange_.lock()) exchange->connectionClosedEarly();
  exchange_.reset();
  currentExchange_ = nullptr;
  server_.connectionClosed(this);
}

void Connection::startNextRequest() {
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(server_.options.maxHeaderBytes, UINT32_MAX)));
  parser_->body_limit(server_.options.maxBodyBytes);
  headerAccepted_ = false;
  if (input_.size() == 0) {
    state_ = State::awaitingRequest;
    armTimer(server_.options.idleTimeoutSeconds);
    return;
  }
  // A pipelined request is already (partly) here.
  state_ = State::readingRequest;
  armTimer(server_.options.requestTimeoutSeconds);
  parseInput();
}

void Connection::readSome() {
  if (reading_ || inputEnded_ || state_ == State::closed) return;
  // A client pipelining requests while one is handled waits until the response is written.
  if (state_ == State::handling && input_.size() >= server_.options.maxHeaderBytes) return;
  reading_ = true;
  socket_.async_read_some(input_.prepare(kReadSize),
                          [self = shared_from_this()](error_code error, size_t bytes) { self->onRead(error, bytes); });
}

void Connection::onRead(error_code error, size_t bytes) {
  reading_ = false;
  if (state_ == State::closed) return;
  if (error) {
    inputEnded_ = true;
    // While closing, the answer still goes out; otherwise the peer left (idle, mid-request, or while
    // its response was pending: then the exchange learns that its client is gone).
    if (state_ != State::closing || (!writing_ && writes_.empty())) closeNow();
    return;
  }
  input_.commit(bytes);
  if (state_ == State::closing) {
    input_.consume(input_.size());
  } else if (state_ == State::awaitingRequest) {
    state_ = State::readingRequest;
    armTimer(server_.options.requestTimeoutSeconds);
    parseInput();
  } else if (state_ == State::readingRequest) {
    parseInput();
  }
  readSome();
}

void Connection::parseInput() {
  while (state_ == State::readingRequest && input_.size() > 0) {
    error_code error;
    size_t used = parser_->put(input_.data(), error);
    input_.consume(used);
    if (error == http::error::need_more) return;
    if (error) {
      answerParseError(error);
      return;
    }
    if (parser_->is_header_done() && !headerAccepted_) {
      if (!acceptHeader()) return;
      headerAccepted_ = true;
    }
    if (parser_->is_done()) {
      dispatch();
      return;
    }
    if (used == 0) return;
  }
}

bool Connection::acceptHeader() {
  if (server_.draining()) {
    answerError(503, "the server is shutting down");
    return false;
  }
  const auto& request = parser_->get();
  // The body limit was checked against Content-Length already (a larger one is a parse error), so a
  // client waiting for 100 Continue is only told to go on when its body will be accepted.
  if (request.version() >= 11 && !parser_->is_done() &&
      equalsIgnoringCase(request[http::field::expect], "100-continue")) {
    queueWrite("HTTP/1.1 100 Continue\r\n\r\n", 0);
  }
  return true;
}

void Connection::answerParseError(error_code error) {
  if (error == http::error::body_limit) {
    answerError(413, "the request body is larger than " + std::to_string(server_.options.maxBodyBytes) + " bytes");
  } else if (error == http::error::header_limit) {
    answerError(431, "the request header is larger than " + std::to_string(server_.options.maxHeaderBytes) + " bytes");
  } else {
    answerError(400, "malformed request: " + error.message());
  }
}

void Connection::dispatch() {
  if (server_.draining()) {
    answerError(503, "the server is shutting down");
    return;
  }
  http::request<http::string_body> message = parser_->release();
  HttpRequest request;
  request.method = std::string(message.method_string());
  std::string_view target = message.target();
  size_t question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question != std::string_view::npos) request.query = std::string(target.substr(question + 1));
  for (const auto& field : message) {
    std::string name = lowerCased(std::string(field.name_string()));
    auto [entry, inserted] = request.headers.emplace(name, std::string(field.value()));
    // Repeated fields combine into one comma-separated list (RFC 9110, section 5.3).
    if (!inserted) entry->second += ", " + std::string(field.value());
  }
  request.body = std::move(message.body());
  keepAlive_ = message.keep_alive();
  http10_ = message.version() < 11;
  headRequest_ = message.method() == http::verb::head;

  state_ = State::handling;
  cancelTimer();
  std::shared_ptr<Exchange> exchange(
      new Exchange(std::move(request), server_.link, weak_from_this(), server_.options.maxQueuedStreamBytes));
  exchange_ = exchange;
  currentExchange_ = exchange.get();
  responseStarted_ = false;
  try {
    server_.handler(exchange);
  } catch (const std::exception& e) {
    if (exchange->unanswered()) {
      exchange->respond(HttpResponse{500, "application/json", server_.errorBody(500, e.what()), {}});
    }
  }
}

void Connection::answerError(int status, const std::string& message) {
  state_ = State::closing;
  keepAlive_ = false;
  input_.consume(input_.size());
  std::string body = server_.errorBody(status, message);
  queueWrite(responseHead(status, "application/json", {}, Framing::contentLength, body.size()) + body, 0);
  responseComplete_ = true;
  // A client that does not read its answer is not waited for beyond the request timeout.
  armTimer(server_.options.requestTimeoutSeconds);
  readSome();
}

std::string Connection::responseHead(int status, const std::string& contentType, const HeaderList& headers,
                                     Framing framing, size_t contentLength) {
  if (server_.draining() || framing == Framing::untilClose) keepAlive_ = false;
  std::string reason(http::obsolete_reason(static_cast<http::status>(status)));
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  if (!contentType.empty()) head += "Content-Type: " + contentType + "\r\n";
  for (const auto& [name, value] : headers) head += name + ": " + value + "\r\n";
  if (framing == Framing::contentLength) head += "Content-Length: " + std::to_string(contentLength) + "\r\n";
  if (framing == Framing::chunked) head += "Transfer-Encoding: chunked\r\n";
  if (!keepAlive_) {
    head += "Connection: close\r\n";
  } else if (http10_) {
    head += "Connection: keep-alive\r\n";
  }
  return head + "\r\n";
}

bool Connection::isCurrent(const Exchange* exchange) const {
  return state_ == State::handling && currentExchange_ == exchange;
}

void Connection::sendResponse(const Exchange* exchange, const HttpResponse& response) {
  if (!isCurrent(exchange)) return;
  std::string bytes = responseHead(response.status, response.contentType, response.headers, Framing::contentLength,
                                   response.body.size());
  if (!headRequest_) bytes += response.body;
  responseStarted_ = true;
  queueWrite(std::move(bytes), 0);
  responseComplete_ = true;
}

void Connection::startStream(const Exchange* exchange, int status, const std::string& contentType,
                             const HeaderList& headers) {
  if (!isCurrent(exchange)) return;
  HeaderList allHeaders = headers;
  if (contentType == "text/event-stream") allHeaders.emplace_back("Cache-Control", "no-cache");
  // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
  streamFraming_ = http10_ ? Framing::untilClose : Framing::chunked;
  responseStarted_ = true;
  queueWrite(responseHead(status, contentType, allHeaders, streamFraming_, 0), 0);
}

void Connection::sendChunk(const Exchange* exchange, std::string data) {
  if (!isCurrent(exchange)) return;
  size_t size = data.size();
  if (streamFraming_ == Framing::chunked) data = hex(size) + "\r\n" + data + "\r\n";
  queueWrite(std::move(data), size);
}

void Connection::endStream(const Exchange* exchange) {
  if (!isCurrent(exchange)) return;
  responseComplete_ = true;
  if (streamFraming_ == Framing::chunked) {
    queueWrite("0\r\n\r\n", 0);
  } else {
    writeNext();
  }
}

void Connection::exchangeAbandoned(const Exchange* exchange) {
  if (!isCurrent(exchange)) return;
  // A stream cut short ends with the connection, so that the client cannot take it for complete.
  if (responseStarted_) {
    closeNow();
    return;
  }
  std::string body = server_.errorBody(500, "the request was dropped without a response");
  responseStarted_ = true;
  queueWrite(responseHead(500, "application/json", {}, Framing::contentLength, body.size()) + body, 0);
  responseComplete_ = true;
}

void Connection::queueWrite(std::string bytes, size_t streamBytes) {
  writes_.push_back({std::move(bytes), streamBytes});
  writeNext();
}

void Connection::writeNext() {
  if (writing_ || state_ == State::closed) return;
  if (writes_.empty()) {
    if (responseComplete_) finishResponse();
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(writes_.front().bytes),
                    [self = shared_from_this()](error_code error, size_t) { self->onWritten(error); });
}

void Connection::onWritten(error_code error) {
  writing_ = false;
  if (state_ == State::closed) return;
  if (error) {
    closeNow();
    return;
  }
  size_t streamBytes = writes_.front().streamBytes;
  writes_.pop_front();
  if (streamBytes > 0) {
    if (std::shared_ptr<Exchange> exchange = exchange_.lock()) exchange->chunkWritten(streamBytes);
  }
  writeNext();
}

void Connection::finishResponse() {
  responseComplete_ = false;
  if (std::shared_ptr<Exchange> exchange = exchange_.lock()) exchange->responseWritten();
  exchange_.reset();
  currentExchange_ = nullptr;
  if (state_ == State::closing || !keepAlive_ || server_.draining()) {
    lingerThenClose();
    return;
  }
  startNextRequest();
  readSome();
}

void Connection::lingerThenClose() {
  state_ = State::closing;
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  if (inputEnded_) {
    closeNow();
    return;
  }
  input_.consume(input_.size());
  armTimer(kLingerSeconds);
  readSome();
}

void Connection::armTimer(double seconds) {
  uint64_t generation = ++timerGeneration_;
  timer_.expires_after(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds)));
  timer_.async_wait([self = shared_from_this(), generation](error_code error) {
    if (!error && generation == self->timerGeneration_) self->onTimer();
  });
}

void Connection::cancelTimer() {
  ++timerGeneration_;
  timer_.cancel();
}

void Connection::onTimer() {
  switch (state_) {
    case State::awaitingRequest: closeNow(); break;
    case State::readingRequest:
      answerError(408,
                  "the request did not arrive within " + std::to_string(server_.options.requestTimeoutSeconds) + " s");
      break;
    case State::closing: closeNow(); break;
    case State::handling:
    case State::closed: break;
  }
}

}  // namespace dgemma::serve::detail
