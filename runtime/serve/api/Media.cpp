#include "runtime/serve/api/Media.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "runtime/serve/api/ApiError.h"
#include "runtime/serve/api/Base64.h"
#include "support/Error.h"

namespace dgemma::serve {
namespace {

namespace fs = std::filesystem;

bool startsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

std::string lowercase(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return lower;
}

// The URL shortened for a message: a data URI can be megabytes.
std::string shownUrl(std::string_view url) {
  constexpr size_t kShown = 64;
  return "\"" + std::string(url.substr(0, kShown)) + (url.size() > kShown ? "...\"" : "\"");
}

ApiError refused(const std::string& param, const std::string& what) { return badRequest(param + ": " + what, param); }

RgbImage decodeOrRefuse(std::string_view bytes, const std::string& param) {
  try {
    return decodeImageBytes(bytes, param);
  } catch (const InputError& error) {
    throw badRequest(error.what(), param);
  }
}

std::string tooLarge(uint64_t bytes, size_t limit, const char* about = "") {
  return "expected an image of at most " + std::to_string(limit) + " bytes, got " + about + std::to_string(bytes) +
         " bytes";
}

RgbImage loadDataUri(std::string_view url, const MediaPolicy& policy, const std::string& param) {
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    throw refused(param, "expected a data URI of the form data:image/png;base64,DATA, got " + shownUrl(url));
  }
  const std::string header = lowercase(url.substr(5, comma - 5));
  if (header != "image/png;base64" && header != "image/jpeg;base64" && header != "image/jpg;base64") {
    throw refused(param,
                  "expected a data URI of a base64 PNG or JPEG image (data:image/png;base64,... or "
                  "data:image/jpeg;base64,...), got " +
                      shownUrl(url.substr(0, comma + 1)));
  }
  const std::string_view encoded = url.substr(comma + 1);
  // Refused before decoding: the decoded size is 3 bytes per 4 characters, less up to 2 of padding.
  const uint64_t decodedBound = encoded.size() / 4 * 3;
  if (decodedBound > policy.maxImageBytes + 2)
    throw refused(param, tooLarge(decodedBound, policy.maxImageBytes, "about "));
  Base64Error error;
  const std::optional<std::string> bytes = decodeBase64(encoded, error);
  if (!bytes) {
    throw refused(param, "invalid base64 at offset " + std::to_string(error.offset) + " of the data: " + error.message);
  }
  if (bytes->size() > policy.maxImageBytes) throw refused(param, tooLarge(bytes->size(), policy.maxImageBytes));
  return decodeOrRefuse(*bytes, param);
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The path of a file: URL ("file:///a%20b.png" -> "/a b.png"); only an empty or "localhost" host.
std::string fileUrlPath(std::string_view url, const std::string& param) {
  std::string_view rest = url.substr(7);
  if (startsWith(rest, "localhost/")) rest.remove_prefix(9);
  if (!startsWith(rest, "/")) {
    throw refused(param, "expected a file URL of a local absolute path (file:///PATH), got " + shownUrl(url));
  }
  std::string path;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] != '%') {
      path.push_back(rest[i]);
      continue;
    }
    const int high = i + 2 < rest.size() ? hexValue(rest[i + 1]) : -1;
    const int low = i + 2 < rest.size() ? hexValue(rest[i + 2]) : -1;
    if (high < 0 || low < 0 || (high == 0 && low == 0)) {
      throw refused(param,
                    "expected a percent escape %XX (not %00) at offset " + std::to_string(7 + i) + " of the URL");
    }
    path.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return path;
}

RgbImage loadLocalFile(const std::string& given, const MediaPolicy& policy, const std::string& param) {
  if (policy.allowedLocalMediaPath.empty()) {
    throw refused(param,
                  "local image files are not allowed (the server has no allowed local media path); send a "
                  "data: URI");
  }
  if (given.find('\0') != std::string::npos) throw refused(param, "expected a file path, got one with a NUL character");
  std::error_code ec;
  const fs::path root = fs::canonical(policy.allowedLocalMediaPath, ec);
  if (ec) throw ApiError(500, "server_error", "the allowed local media path cannot be resolved: " + ec.message());
  const fs::path requested = fs::path(given).is_absolute() ? fs::path(given) : root / given;
  // Canonical: every symlink and ".." resolved, so the prefix check below sees where the file really is.
  const fs::path resolved = fs::canonical(requested, ec);
  if (ec) throw refused(param, "expected an existing image file, got \"" + given + "\" (" + ec.message() + ")");
  const fs::path inside = resolved.lexically_relative(root);
  if (inside.empty() || *inside.begin() == ".." || inside == ".") {
    throw refused(param, "expected a file inside the allowed local media path, got \"" + given + "\"");
  }
  if (!fs::is_regular_file(resolved, ec)) throw refused(param, "expected a regular image file, got \"" + given + "\"");
  const uintmax_t size = fs::file_size(resolved, ec);
  if (ec) throw refused(param, "cannot read \"" + given + "\" (" + ec.message() + ")");
  if (size > policy.maxImageBytes) throw refused(param, tooLarge(size, policy.maxImageBytes));
  std::ifstream file(resolved, std::ios::binary);
  std::string bytes(size, '\0');
  if (!file.read(bytes.data(), static_cast<std::streamsize>(size))) {
    throw refused(param, "cannot read \"" + given + "\"");
  }
  return decodeOrRefuse(bytes, param);
}

}  // namespace

RgbImage loadImageUrl(std::string_view url, const MediaPolicy& policy, const std::string& param) {
  const std::string scheme = lowercase(url.substr(0, std::min<size_t>(url.size(), 8)));
  if (startsWith(scheme, "data:")) return loadDataUri(url, policy, param);
  if (startsWith(scheme, "http://") || startsWith(scheme, "https://")) {
    throw refused(param, "the server does not fetch from the network; send a data: URI");
  }
  if (url.empty()) throw refused(param, "expected an image URL, got an empty string");
  if (startsWith(scheme, "file://")) return loadLocalFile(fileUrlPath(url, param), policy, param);
  const size_t colon = url.find(':');
  const size_t slash = url.find('/');
  if (colon != std::string_view::npos && (slash == std::string_view::npos || colon < slash)) {
    throw refused(param, "expected a data: URI or a local file, got the URL " + shownUrl(url));
  }
  return loadLocalFile(std::string(url), policy, param);
}

}  // namespace dgemma::serve
