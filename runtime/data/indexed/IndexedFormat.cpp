#include "runtime/data/indexed/IndexedFormat.h"

#include <limits>

namespace dgemma {

std::optional<TokenDType> integerTokenDType(uint8_t code) {
  switch (static_cast<TokenDType>(code)) {
    case TokenDType::UInt8:
    case TokenDType::Int8:
    case TokenDType::Int16:
    case TokenDType::Int32:
    case TokenDType::Int64:
    case TokenDType::UInt16: return static_cast<TokenDType>(code);
    case TokenDType::Float64:
    case TokenDType::Float32: break;
  }
  return std::nullopt;
}

std::string tokenDTypeName(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::UInt8: return "uint8";
    case TokenDType::Int8: return "int8";
    case TokenDType::Int16: return "int16";
    case TokenDType::Int32: return "int32";
    case TokenDType::Int64: return "int64";
    case TokenDType::Float64: return "float64";
    case TokenDType::Float32: return "float32";
    case TokenDType::UInt16: return "uint16";
  }
  return "code " + std::to_string(static_cast<int>(dtype));
}

int64_t tokenDTypeBytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::UInt8:
    case TokenDType::Int8: return 1;
    case TokenDType::Int16:
    case TokenDType::UInt16: return 2;
    case TokenDType::Int32:
    case TokenDType::Float32: return 4;
    case TokenDType::Int64:
    case TokenDType::Float64: return 8;
  }
  return 0;
}

int64_t tokenDTypeMinimum(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::Int8: return std::numeric_limits<int8_t>::min();
    case TokenDType::Int16: return std::numeric_limits<int16_t>::min();
    case TokenDType::Int32: return std::numeric_limits<int32_t>::min();
    case TokenDType::Int64: return std::numeric_limits<int64_t>::min();
    default: return 0;
  }
}

int64_t tokenDTypeLimit(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::UInt8: return int64_t{1} << 8;
    case TokenDType::Int8: return int64_t{1} << 7;
    case TokenDType::Int16: return int64_t{1} << 15;
    case TokenDType::UInt16: return int64_t{1} << 16;
    case TokenDType::Int32: return int64_t{1} << 31;
    default: return std::numeric_limits<int64_t>::max();
  }
}

TokenDType tokenDTypeForVocabulary(int64_t vocabularySize) {
  return vocabularySize < 65500 ? TokenDType::UInt16 : TokenDType::Int32;
}

std::string indexPath(const std::string& prefix) { return prefix + ".idx"; }
std::string dataPath(const std::string& prefix) { return prefix + ".bin"; }

}  // namespace dgemma
