// The request a handler receives and the plain response it may answer with (dgemma-serve's HTTP layer).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dgemma::serve {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // the target without the query string, e.g. "/v1/chat/completions"
  std::string query;                           // after '?', may be empty
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string header(const std::string& lowerName) const;  // "" when absent
};

struct HttpResponse {
  int status = 200;
  std::string contentType = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers, e.g. {"Retry-After", "1"}
};

}  // namespace dgemma::serve
