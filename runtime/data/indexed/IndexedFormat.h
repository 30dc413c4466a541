// Megatron's indexed dataset on disk (docs/pretraining.md, "Indexed datasets"): the MMIDIDX layout
// of megatron-core's megatron/core/datasets/indexed_dataset.py (0.16.1), which dgemma writes and
// reads. PREFIX.bin holds the tokens of every sequence back to back in one dtype; PREFIX.idx,
// little-endian:
//
//   offset 0   9 bytes   magic "MMIDIDX\0\0"
//          9   uint64    version, 1
//         17   uint8     dtype code of the tokens (TokenDType)
//         18   uint64    S, the sequence count
//         26   uint64    D, the length of document_indices (the document count + 1)
//         34   int32[S]  sequence_lengths, in tokens
//              int64[S]  sequence_pointers, byte offsets into PREFIX.bin
//              int64[D]  document_indices: 0, then the sequence count after each document
//              int8[S]   sequence_modes, only in the multimodal variant (megatron-core learns that
//                        from its caller, dgemma from the file's size)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dgemma {

inline constexpr std::string_view kIndexMagic{"MMIDIDX\0\0", 9};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr int64_t kIndexHeaderBytes = 34;

// megatron-core's DType codes. The float codes exist in the format but hold no token ids: dgemma
// neither writes nor reads them.
enum class TokenDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

// The dtype of a known integer code; nothing for a float code or an unknown one.
std::optional<TokenDType> integerTokenDType(uint8_t code);
// "uint16", "int32", ... (numpy's names, which megatron-core's DType enum uses).
std::string tokenDTypeName(TokenDType dtype);
int64_t tokenDTypeBytes(TokenDType dtype);
// The token ids the dtype holds are [tokenDTypeMinimum, tokenDTypeLimit).
int64_t tokenDTypeMinimum(TokenDType dtype);
int64_t tokenDTypeLimit(TokenDType dtype);  // int64: INT64_MAX, though int64 holds that id too

// Megatron's DType.optimal_dtype(vocab_size), as preprocess_data.py picks it: uint16 below 65,500
// ids, int32 from there on.
TokenDType tokenDTypeForVocabulary(int64_t vocabularySize);

// PREFIX.idx and PREFIX.bin.
std::string indexPath(const std::string& prefix);
std::string dataPath(const std::string& prefix);

}  // namespace dgemma
