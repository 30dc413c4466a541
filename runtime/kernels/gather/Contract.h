// The contracts of gather and scatter_add (docs/kernels.md), parsed once for every backend:
//   gather:      (table [V, H], ids of i32 or i64) -> y [ids..., H] of table's dtype
//   scatter_add: (ids of i32 or i64, updates [ids..., H] of a float dtype) -> table [V, H] of updates'
//                dtype; optional attribute `skip_id` >= 0 (a global row)
// Both take the optional attribute `row_offset` >= 0 (default 0): the table holds the global rows
// [row_offset, row_offset + V).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct GatherContract {
  DType dtype = DType::F32;      // of the table (and of y for gather, of updates for scatter_add)
  DType idsDtype = DType::I64;
  int64_t vocabulary = 0;        // V
  int64_t width = 0;             // H
  int64_t rowOffset = 0;         // the global row of local row 0
  std::optional<int64_t> skipId;  // scatter_add only; a global row
};

// Both throw InputError for anything their contract does not admit; `dtypes` are the float types the
// calling backend implements for scatter_add's sums (gather moves rows of any dtype).
GatherContract parseGatherContract(const KernelSignature& signature);
GatherContract parseScatterAddContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

}  // namespace dgemma
