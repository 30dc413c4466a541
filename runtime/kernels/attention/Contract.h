// The contracts of attention and attention_backward (docs/kernels.md), parsed once for every backend:
//   attention {mask, window, prefix_len, scale}: (q [B, Tq, Hq, D], k [B, Tk, Hkv, D],
//       v [B, Tk, Hkv, Dv], key_valid [B, Tk] of u8 or bool) -> o [B, Tq, Hq, Dv]; Hq a multiple of Hkv
//   attention_backward: the same inputs and do (o's shape) -> dq, dk, dv of q's, k's and v's shapes
//   Both take an optional attribute trailing_keys (absent: 0; the keys after the last query's own
//   position; above 0 it needs Tq + trailing_keys <= Tk) and optional inputs after those:
//   segment_ids [B, Tk] i64 (mask causal only), the image
//   overlay, then document_ids [B, Tk] i64 (any mask), the packed documents, present when the bool
//   attribute document_ids is true (absent: false). segment_ids is the first optional input (input 4
//   of attention, input 5 of attention_backward) when the count says there is one beyond document_ids.
// q, k, v, o and the gradients share one float dtype.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

enum class AttentionMask { Causal, Bidirectional, Prefix };

struct AttentionContract {
  DType dtype = DType::F32;
  int64_t batch = 0;
  int64_t queries = 0;  // Tq
  int64_t keys = 0;  // Tk
  int64_t queryHeads = 0;
  int64_t kvHeads = 0;
  int64_t headDim = 0;  // D, shared by q and k
  int64_t valueDim = 0;  // Dv
  AttentionMask mask = AttentionMask::Causal;
  int64_t window = 0;  // 0: unlimited; symmetric (|i - j| < window) under the bidirectional mask
  int64_t prefixLen = 0;
  double scale = 1.0;
  // Keys after the last query's own position (step attribute trailing_keys, absent: 0): query i
  // sits at key position Tk - Tq - trailingKeys + i, a context-parallel chunk's place in the keys.
  int64_t trailingKeys = 0;
  bool segmented = false;  // segment_ids given: the causal mask's image overlay
  bool documented = false;  // document_ids given: no key outside the query's document
  // The inputs of the optional ids (meaningful only when given).
  size_t segmentInput = 0, documentInput = 0;
};

// Both throw InputError for anything their contract does not admit; `dtypes` are the float types the
// calling backend implements.
AttentionContract parseAttentionContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
AttentionContract parseAttentionBackwardContract(const KernelSignature& signature,
                                                 std::initializer_list<DType> dtypes);

}  // namespace dgemma
