// dgemma-compile --backend cuda, end to end without a GPU: the training plan and the inference
// entries of tiny-cpu and small-20m, fp32 and bf16 (with elementwise fusion, the default), and an
// expert-parallel training plan (--ep 2 with the all-to-all exchange, rank 0's plan) and plans with
// --optimizer-offload, compiled by the tool; then every kernel step of every entry is handed to the
// CUDA backend's kernel registry (cudaBackendKernels(), which needs no device), or for a step on the
// host arena to its host registry (cudaBackendHostKernels()), whose factory must accept the step's
// dtypes, shapes and attributes, as the executor's plan load does on a GPU. And dgemma-run --backend cuda on a
// machine without a GPU fails with exit 1 saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ToolRunner.h"
#include "plan/HostArena.h"
#include "plan/PlanFile.h"
#include "runtime/backends/cuda/CudaBackend.h"
#include "support/DType.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;

struct PlanCase {
  std::string name;
  std::string model;  // configs/<model>.json
  std::string mode;
  std::string precision;
  std::string layout = "";  // layout flags
};

std::ostream& operator<<(std::ostream& out, const PlanCase& c) { return out << c.name; }

class CudaPlan : public ::testing::TestWithParam<PlanCase> {
 protected:
  ScratchDirectory dir;
};

TEST_P(CudaPlan, EveryKernelStepHasACudaKernelThatAcceptsIt) {
  const PlanCase& c = GetParam();
  const std::string planDir = dir / "plan";
  const testing::ToolResult compiled =
      runTool(std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR + "/models/diffusion_gemma/configs/" +
              c.model + ".json --mode " + c.mode + " --precision " + c.precision +
              " --micro-batch 2 --prompt-len 32 --backend cuda " + c.layout + " -o " + planDir);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  const Plan plan = readPlanFile(planFileForRank(planDir, 0));
  EXPECT_EQ(plan.metadata.value("backend", ""), "cuda");
  EXPECT_EQ(plan.metadata.value("fusion", ""), "on");

  const KernelRegistry registry = cudaBackendKernels();
  // --optimizer-offload: a step on the host arena's buffers only runs a host kernel, a copy across
  // is a transfer (runtime/exec/Executor.cpp places them so).
  const KernelRegistry hostRegistry = cudaBackendHostKernels();
  auto inHostArena = [&](int64_t id) { return isHostArena(plan.arenas[plan.buffers[id].arena]); };
  std::set<std::string> entries, ops;
  int64_t kernelSteps = 0, bf16Matmuls = 0, hostSteps = 0, transfers = 0;
  std::map<std::string, std::string> failures;  // op -> the first step's error
  for (const EntryPoint& entry : plan.entryPoints) {
    entries.insert(entry.name);
    for (size_t i = 0; i < entry.steps.size(); ++i) {
      const Step& step = entry.steps[i];
      if (step.kind != Step::Kind::Kernel) continue;
      ++kernelSteps;
      ops.insert(step.op);
      if (step.op == "matmul" && plan.buffers[step.inputs.at(0)].dtype == DType::BF16) ++bf16Matmuls;
      const bool onHost = std::all_of(step.inputs.begin(), step.inputs.end(), inHostArena) &&
                          std::all_of(step.outputs.begin(), step.outputs.end(), inHostArena);
      if (!onHost && step.op == "copy" && (inHostArena(step.inputs.at(0)) || inHostArena(step.outputs.at(0)))) {
        ++transfers;
        continue;
      }
      hostSteps += onHost;
      const KernelFactory* factory = (onHost ? hostRegistry : registry).find(step.op);
      if (factory == nullptr) {
        failures.emplace(step.op, onHost ? "no host kernel" : "no cuda kernel");
        continue;
      }
      KernelSignature signature;
      signature.step = &step;
      signature.where = entry.name + " step " + std::to_string(i) + " (" + step.op + ")";
      for (int64_t id : step.inputs) signature.inputs.push_back(&plan.buffers[id]);
      for (int64_t id : step.outputs) signature.outputs.push_back(&plan.buffers[id]);
      try {
        EXPECT_NE((*factory)(signature), nullptr) << signature.where;
      } catch (const InputError& error) {
        failures.emplace(step.op, error.what());
      }
    }
  }
  for (const auto& [op, error] : failures) ADD_FAILURE() << c.name << ": " << op << ": " << error;
  if (c.mode == "train") {
    EXPECT_TRUE(entries.count("train_step")) << "no train_step entry";
    // The training step's kernels that only the training plan has.
    for (const char* op :
         {"adamw", "rms_norm_backward", "attention_backward", "cross_entropy_backward", "fused_elementwise"})
      EXPECT_TRUE(ops.count(op)) << op << " is not in the " << c.name << " plan";
  } else {
    EXPECT_TRUE(ops.count("canvas_sample")) << "no canvas_sample step in the " << c.name << " plan";
  }
  // A bf16 plan's matmuls have bf16 operands (c bf16, or f32 where the plan keeps the product in
  // f32), which the backend hands to matmul's own bf16 kernel (cuBLASLt) rather than widening them.
  if (c.precision == "bf16") {
    EXPECT_GT(bf16Matmuls, 0) << "no bf16 matmul in the " << c.name << " plan";
    EXPECT_TRUE(registry.traits("matmul").handlesReducedFloats);
  }
  // The experts: expert parallelism's dispatch and local experts, or moe_experts.
  std::vector<std::string> experts = {"moe_experts"};
  if (c.layout.find("--ep") != std::string::npos) experts = {"moe_dispatch", "moe_local_experts"};
  if (c.mode == "train") experts.push_back(experts.back() + "_backward");
  for (const std::string& op : experts) EXPECT_TRUE(ops.count(op)) << op << " is not in the " << c.name << " plan";
  // Each offloaded parameter's adamw runs on the host between its copies in and back.
  if (c.layout.find("--optimizer-offload") != std::string::npos) {
    EXPECT_GT(hostSteps, 0) << "no host step in the " << c.name << " plan";
    EXPECT_GT(transfers, 2 * hostSteps) << "too few copies across the host arena in the " << c.name << " plan";
  } else {
    EXPECT_EQ(hostSteps + transfers, 0) << "host arena steps in the " << c.name << " plan";
  }
  std::cout << "[ cuda plan ] " << c.name << ": " << entries.size() << " entries, " << kernelSteps
            << " kernel steps of " << ops.size() << " kernels (" << bf16Matmuls
            << " bf16 matmuls), all accepted by the cuda backend: " << (failures.empty() ? "yes" : "no") << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaPlan,
    ::testing::Values(
        PlanCase{"tiny_cpu_train_fp32", "tiny-cpu", "train", "fp32"},
        PlanCase{"tiny_cpu_train_bf16", "tiny-cpu", "train", "bf16"},
        PlanCase{"tiny_cpu_infer_fp32", "tiny-cpu", "infer", "fp32"},
        PlanCase{"tiny_cpu_infer_bf16", "tiny-cpu", "infer", "bf16"},
        PlanCase{"small_20m_train_fp32", "small-20m", "train", "fp32"},
        PlanCase{"small_20m_train_bf16", "small-20m", "train", "bf16"},
        PlanCase{"small_20m_infer_bf16", "small-20m", "infer", "bf16"},
        PlanCase{"tiny_cpu_train_bf16_ep2", "tiny-cpu", "train", "bf16", "--dp 2 --ep 2 --expert-exchange all-to-all"},
        PlanCase{"tiny_cpu_train_bf16_offload_all", "tiny-cpu", "train", "bf16", "--optimizer-offload all"},
        PlanCase{"tiny_cpu_train_fp32_ep2_offload_experts", "tiny-cpu", "train", "fp32",
                 "--dp 2 --ep 2 --expert-exchange all-to-all --optimizer-offload experts"}),
    [](const ::testing::TestParamInfo<PlanCase>& info) { return info.param.name; });

// One rank on --backend cuda without a GPU: exit 1, the flag and the reason named, no crash.
TEST(CudaRun, WithoutAGpuFailsNamingTheBackend) {
  std::string reason;
  if (cudaDeviceAvailable(&reason)) GTEST_SKIP() << "this machine has a usable CUDA device";
  ScratchDirectory dir;
  const std::string plan = dir / "plan";
  const testing::ToolResult compiled = runTool(
      std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
      "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --micro-batch 2 --prompt-len 16 --backend cuda -o " +
      plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  const testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " train --plan " + plan +
                                          " --init random --seed 1 --train mock --steps 1 --backend cuda");
  EXPECT_EQ(ran.exitCode, 1) << ran.output;
  EXPECT_TRUE(contains(ran, "error: --backend cuda: cuda backend: no usable CUDA device: ")) << ran.output;
  EXPECT_TRUE(contains(ran, reason)) << ran.output;
}

}  // namespace
}  // namespace dgemma
