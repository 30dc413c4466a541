// Writes the plan seeds of fuzz/corpus/plan/ (scripts/fuzz.sh --write-plan-seeds): the unit tests'
// small plan, and the same plan with every optional field set, serialized by this build's writer so
// that they carry a valid hash and format version.   Usage: write_plan_seeds DIRECTORY
#include <cstdio>
#include <string>

#include "plan/PlanFile.h"
#include "test/unit/plan/PlanFixtures.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_plan_seeds DIRECTORY\n");
    return 2;
  }
  const std::string directory = argv[1];
  dgemma::Plan small = dgemma::testing::smallPlan();
  dgemma::writePlanFile(small, directory + "/small.dgplan");

  dgemma::Plan full = dgemma::testing::smallPlan();
  full.mesh = {{"dp", 1, 0}};
  full.metadata = {{"model", "toy"}};
  full.modelFamily = dgemma::ModelFamily::DiffusionGemma;
  full.modelConfig = {{"model_type", "toy"}};
  full.bucketPadding = dgemma::BucketPadding{"prompt_len", 0, {{"x", 7}}, {"y"}};
  full.runDefaults = dgemma::RunDefaults{"toy-preset", {{"lr", 0.5}, {"steps", 3}}};
  full.generation = dgemma::GenerationSettings{4, 9, 14, 7, 0.25, 0.3, 0.9, 2, 0.01, {1, 106}, 3};
  full.sections.push_back({"constants", {1, 2, 3, 4, 5}});
  full.entryPoints[0].numStreams = 2;
  full.entryPoints[0].numEvents = 1;
  full.entryPoints[0].steps[0].stream = 1;
  full.entryPoints[0].steps[0].signalEvents = {0};
  full.entryPoints[0].steps[0].attrs = {{"eps", 1e-6}, {"perm", {1, 0}}};
  dgemma::writePlanFile(full, directory + "/every-field.dgplan");
  return 0;
}
