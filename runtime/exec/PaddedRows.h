// Parameters whose trailing rows are padding (docs/parallelism.md, "Vocabulary padding"): the plan's
// init spec names the real row count ("logical_rows"); the rows after it are zero, read from no
// checkpoint and written to no export, so checkpoints and exports hold the logical tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "plan/Plan.h"
#include "runtime/core/HostTensor.h"

namespace dgemma {

// The real rows of `parameter`, or nullopt when it has no padding. InputError when the plan's
// "logical_rows" is not an integer in [1, rows].
std::optional<int64_t> logicalRows(const Parameter& parameter);

// The parameter's global shape without its padding rows (its global shape when it has none).
std::vector<int64_t> logicalShape(const Parameter& parameter);

// `logical` [R, ...] followed by zero rows up to `rows` rows.
HostTensor withZeroRows(const HostTensor& logical, int64_t rows);

// The first `rows` rows of `padded`.
HostTensor firstRows(const HostTensor& padded, int64_t rows);

}  // namespace dgemma
