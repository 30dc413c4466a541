#include "runtime/exec/PaddedRows.h"

#include <algorithm>
#include <string>

#include "support/Error.h"

namespace dgemma {

namespace {

uint64_t rowBytes(const HostTensor& tensor) {
  return tensor.shape.empty() || tensor.shape[0] == 0 ? 0 : tensor.data.size() / static_cast<uint64_t>(tensor.shape[0]);
}

}  // namespace

std::optional<int64_t> logicalRows(const Parameter& parameter) {
  if (!parameter.init.is_object()) return std::nullopt;
  auto field = parameter.init.find("logical_rows");
  if (field == parameter.init.end()) return std::nullopt;
  const int64_t rows = parameter.globalShape.empty() ? 0 : parameter.globalShape[0];
  if (!field->is_number_integer() || field->get<int64_t>() < 1 || field->get<int64_t>() > rows)
    throw InputError("--plan: parameter " + parameter.name + ": init.logical_rows: expected an integer in [1, " +
                     std::to_string(rows) + "], got " + field->dump());
  if (field->get<int64_t>() == rows) return std::nullopt;
  return field->get<int64_t>();
}

std::vector<int64_t> logicalShape(const Parameter& parameter) {
  std::vector<int64_t> shape = parameter.globalShape;
  if (const std::optional<int64_t> rows = logicalRows(parameter)) shape[0] = *rows;
  return shape;
}

HostTensor withZeroRows(const HostTensor& logical, int64_t rows) {
  std::vector<int64_t> shape = logical.shape;
  shape[0] = rows;
  HostTensor padded(logical.dtype, shape);  // zero-filled
  std::copy(logical.data.begin(),
            logical.data.begin() + static_cast<ptrdiff_t>(std::min(logical.data.size(), padded.data.size())),
            padded.data.begin());
  return padded;
}

HostTensor firstRows(const HostTensor& padded, int64_t rows) {
  std::vector<int64_t> shape = padded.shape;
  shape[0] = rows;
  HostTensor logical(padded.dtype, shape);
  std::copy(padded.data.begin(),
            padded.data.begin() + static_cast<ptrdiff_t>(rowBytes(padded) * static_cast<uint64_t>(rows)),
            logical.data.begin());
  return logical;
}

}  // namespace dgemma
