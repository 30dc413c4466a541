// A small valid plan for the plan tests: y = x + w with one parameter, one input, one output.
#pragma once

#include "plan/Plan.h"

namespace dgemma::testing {

inline Plan smallPlan() {
  Plan plan;
  plan.producer = "test";
  plan.arenas = {{"persistent", true, 64, 64}, {"scratch", false, 128, 64}};
  Buffer weight{0, "w", DType::F32, {4}, 0, 0, std::nullopt, std::nullopt};
  Buffer input{1, "x", DType::F32, {4}, 1, 0, Lifetime{"forward[prompt_len=4]", 0, 0}, std::nullopt};
  Buffer output{2, "y", DType::F32, {4}, 1, 64, Lifetime{"forward[prompt_len=4]", 0, 0}, std::nullopt};
  plan.buffers = {weight, input, output};
  Parameter parameter;
  parameter.name = "w";
  parameter.buffer = 0;
  parameter.globalShape = {4};
  parameter.shardOffset = {0};
  parameter.shardShape = {4};
  parameter.init = {{"kind", "ones"}};
  plan.parameters = {parameter};
  EntryPoint entry;
  entry.name = "forward";
  entry.bucket = {{"prompt_len", 4}};
  entry.inputs = {{"x", 1}};
  entry.outputs = {{"y", 2}};
  Step step;
  step.op = "add";
  step.inputs = {1, 0};
  step.outputs = {2};
  step.location = "test.mlir:3:5";
  entry.steps = {step};
  plan.entryPoints = {entry};
  return plan;
}

}  // namespace dgemma::testing
