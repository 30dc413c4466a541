// A minimal HTTP client over a blocking POSIX socket, so that the server tests control every byte
// sent and see every byte received (pipelining, partial requests, disconnects mid-stream).
#pragma once

#include <map>
#include <string>

namespace dgemma::serve::test {

struct ReceivedResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string header(const std::string& lowerName) const;
};

class TestClient {
 public:
  // Connects to 127.0.0.1:port; reads give up after `receiveTimeoutSeconds` (a failure, not a timing).
  explicit TestClient(int port, int receiveTimeoutSeconds = 30);
  ~TestClient();
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  // Whether connect() to 127.0.0.1:port succeeds.
  static bool canConnect(int port);

  // Sends all of `bytes`; false when the server has closed or reset the connection.
  bool send(const std::string& bytes);
  // The status line and headers of the next response (a 100 Continue counts as one).
  ReceivedResponse readHead();
  // A whole response: head, then a Content-Length or chunked body.
  ReceivedResponse readResponse();
  // One chunk of a chunked body; "" for the terminal chunk.
  std::string readChunk();
  // Whatever bytes have arrived (waiting for some when none have); "" at the end of the stream.
  std::string readSome();
  // Whether the server closed the connection (end of stream, or reset) with nothing more to read.
  bool closedByServer();
  void close();

 private:
  bool fill();  // reads more bytes into buffer_; false at end of stream or on an error
  std::string readLine();
  std::string readExactly(size_t size);

  int fd_ = -1;
  std::string buffer_;
};

}  // namespace dgemma::serve::test
