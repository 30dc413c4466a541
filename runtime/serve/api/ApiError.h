// The errors dgemma-serve answers with, in OpenAI's error JSON (docs/serving.md, "Errors"):
//
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature" or null,
//              "code": null or "request_too_large"}}
//
// The type follows the status. OpenAI itself reports most client errors as "invalid_request_error"
// and tells them apart by a string "code"; vLLM reports the name of the exception class the status
// maps to ("BadRequestError", "NotFoundError") with the numeric status as "code". The types below
// are OpenAI's snake_case spelling of those classes (the ones its Python SDK raises per status).
// Clients choose their exception by the HTTP status, not by the type, so they behave the same:
//
//   400, 413, 422 and other 4xx  invalid_request_error (413 with code "request_too_large")
//   401                          authentication_error
//   403                          permission_error
//   404                          not_found_error
//   429                          rate_limit_error
//   503                          service_unavailable_error
//   500 and other 5xx            server_error
#pragma once

#include <stdexcept>
#include <string>

namespace dgemma::serve {

struct ApiError : std::runtime_error {
  // `param` and `code` empty: null in the JSON.
  ApiError(int status, std::string type, std::string message, std::string param = "", std::string code = "");
  int status;
  std::string type, param, code;
};

// 400 invalid_request_error.
ApiError badRequest(std::string message, std::string param = "");

// The error type of the table above for an HTTP status.
std::string errorTypeForStatus(int status);

std::string errorJson(const ApiError& error);
// An error of the status's type (and code, for 413) with `message`; param null.
std::string errorJson(int status, const std::string& message);

}  // namespace dgemma::serve
