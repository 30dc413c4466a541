#include <gtest/gtest.h>

#include "PlanFixtures.h"
#include "support/Error.h"
#include "plan/HostArena.h"
#include "plan/PlanFile.h"

namespace dgemma {
namespace {

using testing::smallPlan;

std::string validationError(const Plan& plan) {
  try {
    validatePlan(plan, "p");
  } catch (const InputError& error) {
    return error.what();
  }
  return "accepted";
}

TEST(PlanValidate, AcceptsTheFixture) { EXPECT_EQ(validationError(smallPlan()), "accepted"); }

TEST(PlanValidate, RejectsOverlappingLiveBuffers) {
  Plan plan = smallPlan();
  plan.buffers[2].offset = 0;  // output on top of the input while both are live at step 0
  EXPECT_EQ(validationError(plan), "p: buffers[2]: overlaps buffer 1 in arena \"scratch\" while both are live");
}

TEST(PlanValidate, AllowsSharingAcrossDisjointLifetimes) {
  Plan plan = smallPlan();
  Step second = plan.entryPoints[0].steps[0];
  second.inputs = {2, 0};
  second.outputs = {3};
  plan.entryPoints[0].steps.push_back(second);
  plan.buffers.push_back({3, "z", DType::F32, {4}, 1, 0, Lifetime{"forward[prompt_len=4]", 1, 1}, std::nullopt});
  plan.buffers[2].lifetime->last = 1;
  plan.entryPoints[0].outputs = {{"z", 3}};
  EXPECT_EQ(validationError(plan), "accepted");  // z reuses x's bytes after x died
}

TEST(PlanValidate, RejectsUseOutsideLifetime) {
  Plan plan = smallPlan();
  plan.buffers[1].lifetime = Lifetime{"forward[prompt_len=4]", 1, 1};
  plan.buffers[1].offset = 0;
  EXPECT_NE(validationError(plan).find("buffer 1 is used at step 0 outside its lifetime [1, 1]"), std::string::npos);
}

TEST(PlanValidate, RejectsBufferOfAnotherEntry) {
  Plan plan = smallPlan();
  plan.buffers[2].lifetime->entry = "other";
  EXPECT_NE(validationError(plan).find("buffer 2 belongs to entry \"other\""), std::string::npos);
}

TEST(PlanValidate, RejectsAnInferenceEntryWithoutGenerationSettings) {
  Plan plan = smallPlan();
  plan.entryPoints[0].name = "denoise";
  for (Buffer& buffer : plan.buffers)
    if (buffer.lifetime) buffer.lifetime->entry = plan.entryPoints[0].key();
  EXPECT_EQ(validationError(plan), "p: entry_points[0]: an inference entry (\"denoise\") needs the plan's generation field");
  plan.generation = GenerationSettings{4, 8, 12};
  EXPECT_EQ(validationError(plan), "accepted");
}

TEST(PlanValidate, RejectsDanglingIds) {
  Plan plan = smallPlan();
  plan.entryPoints[0].steps[0].inputs = {1, 9};
  EXPECT_EQ(validationError(plan), "p: entry_points[0].steps[0].inputs[1]: no buffer 9 (plan has 3)");
}

TEST(PlanValidate, RejectsParameterBoxOutsideGlobalShape) {
  Plan plan = smallPlan();
  plan.parameters[0].globalShape = {8};
  plan.parameters[0].shardOffset = {6};
  EXPECT_EQ(validationError(plan), "p: parameters[0].shard_offset: the shard box leaves the global shape in dimension 0");
}

TEST(PlanValidate, AcceptsAnInputBoxInsideItsGlobalShape) {
  Plan plan = smallPlan();
  plan.entryPoints[0].inputs[0].globalShape = {8};
  plan.entryPoints[0].inputs[0].shardOffset = {4};
  EXPECT_EQ(validationError(plan), "accepted");
}

TEST(PlanValidate, RejectsAnOutputBoxOutsideItsGlobalShape) {
  Plan plan = smallPlan();
  plan.entryPoints[0].outputs[0].globalShape = {8};
  plan.entryPoints[0].outputs[0].shardOffset = {6};
  EXPECT_EQ(validationError(plan),
            "p: entry_points[0].outputs[0].shard_offset: the box [6, 10) of buffer 2 leaves global_shape 8 in dimension 0");
}

TEST(PlanValidate, RejectsABoxWhoseDimensionsDifferFromItsBuffer) {
  Plan plan = smallPlan();
  plan.entryPoints[0].inputs[0].globalShape = {2, 4};
  plan.entryPoints[0].inputs[0].shardOffset = {0, 0};
  EXPECT_EQ(validationError(plan), "p: entry_points[0].inputs[0].global_shape: has 2 dimensions, buffer 1 has 1");
  plan.entryPoints[0].inputs[0].shardOffset = {0};
  EXPECT_EQ(validationError(plan), "p: entry_points[0].inputs[0].shard_offset: has 1 dimensions, global_shape has 2");
}

TEST(PlanValidate, RejectsParameterInScratch) {
  Plan plan = smallPlan();
  plan.parameters[0].buffer = 1;
  EXPECT_EQ(validationError(plan), "p: parameters[0].buffer: a parameter must live in a persistent arena");
}

// The host arena (--optimizer-offload) holds only persistent state.
TEST(PlanValidate, RejectsScratchHostArena) {
  Plan plan = smallPlan();
  plan.arenas.push_back({kHostArenaName, true, 64, 64});
  EXPECT_EQ(validationError(plan), "accepted");
  plan.arenas.back().persistent = false;
  EXPECT_EQ(validationError(plan), "p: arenas[2].persistent: the host arena must be persistent");
}

TEST(PlanValidate, RejectsUnknownCollectiveAxis) {
  Plan plan = smallPlan();
  plan.entryPoints[0].steps[0].kind = Step::Kind::Collective;
  plan.entryPoints[0].steps[0].axis = "tp";
  EXPECT_EQ(validationError(plan), "p: entry_points[0].steps[0].axis: no mesh axis \"tp\"");
}

TEST(PlanValidate, RejectsMeshThatDoesNotMatchWorldSize) {
  Plan plan = smallPlan();
  plan.mesh = {{"dp", 2, 0}};
  EXPECT_EQ(validationError(plan), "p: mesh: axis sizes multiply to 2, world_size is 1");
}

TEST(PlanValidate, RejectsBadEvents) {
  Plan plan = smallPlan();
  plan.entryPoints[0].steps[0].waitEvents = {0};
  EXPECT_EQ(validationError(plan), "p: entry_points[0].steps[0].wait: no event 0");
}

TEST(PlanValidate, RejectsConstantSizeMismatch) {
  Plan plan = smallPlan();
  plan.sections.push_back({"constants", std::vector<uint8_t>(8)});
  plan.constants.push_back({0, 0, 0, 8});
  EXPECT_EQ(validationError(plan), "p: constants[0].bytes: 8 differs from the buffer's 16");
}

TEST(PlanValidate, RejectsMisplacedView) {
  Plan plan = smallPlan();
  plan.buffers.push_back({3, "x.view", DType::F32, {2, 2}, 1, 2, plan.buffers[1].lifetime, 1});
  EXPECT_EQ(validationError(plan), "p: buffers[3].offset: 2 is not aligned to the element size");
  plan.buffers[3].offset = 8;
  EXPECT_EQ(validationError(plan), "p: buffers[3].alias_of: a view must cover exactly the bytes of buffer 1");
}

}  // namespace
}  // namespace dgemma
