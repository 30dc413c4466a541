// Shape arithmetic shared by the plan format, the runtime and the tools.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dgemma {

int64_t numElementsOf(const std::vector<int64_t>& shape);
std::string shapeToString(const std::vector<int64_t>& shape);  // "[2,3,4]"

}  // namespace dgemma
