#include "TestClient.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <stdexcept>
#include <utility>

namespace dgemma::serve::test {

namespace {

int connectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string ReceivedResponse::header(const std::string& lowerName) const {
  auto found = headers.find(lowerName);
  return found == headers.end() ? std::string() : found->second;
}

TestClient::TestClient(int port, int receiveTimeoutSeconds) : fd_(connectTo(port)) {
  if (fd_ < 0) throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
  timeval timeout{receiveTimeoutSeconds, 0};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
}

TestClient::~TestClient() { close(); }

bool TestClient::canConnect(int port) {
  int fd = connectTo(port);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

void TestClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool TestClient::send(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool TestClient::fill() {
  char chunk[16384];
  ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
  if (n <= 0) return false;
  buffer_.append(chunk, static_cast<size_t>(n));
  return true;
}

std::string TestClient::readLine() {
  size_t end;
  while ((end = buffer_.find("\r\n")) == std::string::npos) {
    if (!fill()) throw std::runtime_error("connection ended inside a line: '" + buffer_ + "'");
  }
  std::string line = buffer_.substr(0, end);
  buffer_.erase(0, end + 2);
  return line;
}

std::string TestClient::readExactly(size_t size) {
  while (buffer_.size() < size) {
    if (!fill()) throw std::runtime_error("connection ended inside a body");
  }
  std::string bytes = buffer_.substr(0, size);
  buffer_.erase(0, size);
  return bytes;
}

ReceivedResponse TestClient::readHead() {
  ReceivedResponse response;
  std::string statusLine = readLine();
  if (statusLine.rfind("HTTP/1.", 0) != 0 || statusLine.size() < 12) {
    throw std::runtime_error("not a status line: '" + statusLine + "'");
  }
  response.status = std::stoi(statusLine.substr(9, 3));
  for (std::string line = readLine(); !line.empty(); line = readLine()) {
    size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    size_t valueStart = line.find_first_not_of(' ', colon + 1);
    response.headers[name] = valueStart == std::string::npos ? "" : line.substr(valueStart);
  }
  return response;
}

ReceivedResponse TestClient::readResponse() {
  ReceivedResponse response = readHead();
  if (response.header("transfer-encoding") == "chunked") {
    for (std::string chunk = readChunk(); !chunk.empty(); chunk = readChunk()) response.body += chunk;
  } else if (!response.header("content-length").empty()) {
    response.body = readExactly(std::stoul(response.header("content-length")));
  }
  return response;
}

std::string TestClient::readChunk() {
  size_t size = std::stoul(readLine(), nullptr, 16);
  std::string data = readExactly(size);
  if (!readLine().empty()) throw std::runtime_error("a chunk does not end with CRLF");
  return data;
}

std::string TestClient::readSome() {
  if (buffer_.empty()) fill();
  return std::exchange(buffer_, std::string());
}

bool TestClient::closedByServer() {
  if (!buffer_.empty()) return false;
  char byte;
  ssize_t n = ::recv(fd_, &byte, 1, 0);
  if (n > 0) {
    buffer_.push_back(byte);
    return false;
  }
  // A receive timeout (EAGAIN) is not a close.
  return n == 0 || errno == ECONNRESET;
}

}  // namespace dgemma::serve::test
