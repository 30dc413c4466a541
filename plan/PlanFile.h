// Reading and writing plan files. Every structural error is reported as an InputError naming the
// file and the field, so a truncated, edited or foreign file never reaches the executor.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "plan/Plan.h"

namespace dgemma {

// The JSON header of a plan (what `dgemma-compile --emit plan-json` prints).
nlohmann::json planToJson(const Plan& plan);
// `source` names the file in error messages.
Plan planFromJson(const nlohmann::json& header, const std::string& source);

// Checks cross-references: buffer ids, arena bounds, overlapping live buffers, parameter boxes,
// constant ranges, step operands. Throws InputError on the first problem.
void validatePlan(const Plan& plan, const std::string& source);

// What a reader says about a plan of another format version: version 1 is named as no longer read.
std::string unreadVersionMessage(uint64_t version);

// Binary container: magic, version, sizes, XXH3-64 content hash, JSON header, sections.
std::string serializePlan(const Plan& plan);
Plan deserializePlan(const std::string& bytes, const std::string& source);

// File helpers; writes are atomic (temporary file + fsync + rename).
void writePlanFile(const Plan& plan, const std::string& path);
Plan readPlanFile(const std::string& path);

// A plan directory holds one file per rank: rank-<r>.dgplan.
std::string planFileForRank(const std::string& planDir, int64_t rank);

}  // namespace dgemma
