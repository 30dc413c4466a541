#include "runtime/serve/http/HttpMessage.h"

namespace dgemma::serve {

std::string HttpRequest::header(const std::string& lowerName) const {
  auto found = headers.find(lowerName);
  return found == headers.end() ? std::string() : found->second;
}

}  // namespace dgemma::serve
