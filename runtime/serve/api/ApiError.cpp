#include "runtime/serve/api/ApiError.h"

#include <nlohmann/json.hpp>

namespace dgemma::serve {

ApiError::ApiError(int status, std::string type, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status(status),
      type(std::move(type)),
      param(std::move(param)),
      code(std::move(code)) {}

ApiError badRequest(std::string message, std::string param) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param));
}

std::string errorTypeForStatus(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string errorJson(const ApiError& error) {
  auto orNull = [](const std::string& value) {
    return value.empty() ? nlohmann::json(nullptr) : nlohmann::json(value);
  };
  nlohmann::json body = {{"error",
                          {{"message", error.what()},
                           {"type", error.type},
                           {"param", orNull(error.param)},
                           {"code", orNull(error.code)}}}};
  // Messages quote request text, which may hold invalid UTF-8 when it came from a non-JSON body.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string errorJson(int status, const std::string& message) {
  return errorJson(ApiError(status, errorTypeForStatus(status), message, "", status == 413 ? "request_too_large" : ""));
}

}  // namespace dgemma::serve
