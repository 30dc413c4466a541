// The registry, the factory helpers of Kernel.h, and the factories' rejection of bad signatures.
#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

TEST(KernelRegistry, FindReturnsNullForUnknownNames) {
  EXPECT_NE(cpuKernels().find("matmul"), nullptr);
  EXPECT_EQ(cpuKernels().find("all_reduce"), nullptr);  // collectives are not kernels
}

TEST(KernelRegistry, AddingANameTwiceIsALogicError) {
  KernelRegistry registry;
  registry.add("twice", [](const KernelSignature&) { return std::unique_ptr<Kernel>(); });
  EXPECT_THROW(registry.add("twice", [](const KernelSignature&) { return std::unique_ptr<Kernel>(); }),
               std::logic_error);
}

// Runs `body` and returns the message of the InputError it throws.
std::string inputErrorOf(const std::function<void()>& body) {
  try {
    body();
  } catch (const InputError& error) {
    EXPECT_EQ(error.exitCode(), 2);
    return error.what();
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

TEST(KernelHelpers, AttributesAreRequiredAndReadWithTypeChecks) {
  Step step;
  step.attrs = {{"eps", 1e-6}, {"axis", -1}, {"flag", true}, {"dims", {0, 2}}, {"word", "text"},
                {"huge", 18446744073709551615ull}, {"mixed", {1, "a"}}};
  KernelSignature signature;
  signature.step = &step;
  signature.where = "plan: step 7";

  EXPECT_DOUBLE_EQ(attrDouble(signature, "eps"), 1e-6);
  EXPECT_DOUBLE_EQ(attrDouble(signature, "axis"), -1.0);  // an integer is a number too
  EXPECT_EQ(attrInt(signature, "axis"), -1);
  EXPECT_TRUE(attrBool(signature, "flag"));
  EXPECT_EQ(attrInts(signature, "dims"), (std::vector<int64_t>{0, 2}));

  // Every attribute is required: the plan carries the op's defaults.
  EXPECT_EQ(inputErrorOf([&] { attrDouble(signature, "absent"); }), "plan: step 7: attribute 'absent' is missing");
  EXPECT_EQ(inputErrorOf([&] { attrInt(signature, "absent"); }), "plan: step 7: attribute 'absent' is missing");
  EXPECT_EQ(inputErrorOf([&] { attrBool(signature, "absent"); }), "plan: step 7: attribute 'absent' is missing");
  EXPECT_EQ(inputErrorOf([&] { attrInts(signature, "absent"); }), "plan: step 7: attribute 'absent' is missing");
  EXPECT_EQ(inputErrorOf([&] { attrDouble(signature, "word"); }), "plan: step 7: attribute 'word': expected a number");
  EXPECT_EQ(inputErrorOf([&] { attrInt(signature, "eps"); }), "plan: step 7: attribute 'eps': expected an integer");
  EXPECT_EQ(inputErrorOf([&] { attrInt(signature, "huge"); }), "plan: step 7: attribute 'huge': expected an integer");
  EXPECT_EQ(inputErrorOf([&] { attrBool(signature, "axis"); }), "plan: step 7: attribute 'axis': expected a boolean");
  EXPECT_EQ(inputErrorOf([&] { attrInts(signature, "mixed"); }),
            "plan: step 7: attribute 'mixed': expected an array of integers");
}

TEST(KernelHelpers, ArityAndDTypeMessagesNameWhatWasExpected) {
  Buffer buffer;
  buffer.dtype = DType::I32;
  KernelSignature signature;
  signature.where = "w";
  signature.inputs = {&buffer};
  EXPECT_EQ(inputErrorOf([&] { expectArity(signature, 2, 1); }),
            "w: expected 2 inputs and 1 output, got 1 input and 0 outputs");
  EXPECT_EQ(inputErrorOf([&] { expectArityRange(signature, 2, 3, 1); }),
            "w: expected 2 to 3 inputs and 1 output, got 1 input and 0 outputs");
  EXPECT_EQ(inputErrorOf([&] { expectDType(signature, buffer, {DType::F32, DType::F64, DType::BF16}, "input x"); }),
            "w: input x has dtype i32, expected f32, f64 or bf16");
  EXPECT_NO_THROW(expectDType(signature, buffer, {DType::I64, DType::I32}, "input ids"));
}

TEST(KernelFactories, RejectWrongArity) {
  KernelCall call("add");
  call.input<float>(DType::F32, {2}, {1, 2}).output(DType::F32, {2});
  EXPECT_EQ(factoryError(call), "step 0 (add): expected 2 inputs and 1 output, got 1 input and 1 output");

  KernelCall norm("rms_norm", {{"eps", 1e-6}});
  for (int i = 0; i < 3; ++i) norm.input<float>(DType::F32, {2}, {1, 2});
  norm.output(DType::F32, {2});
  EXPECT_EQ(factoryError(norm), "step 0 (rms_norm): expected 1 to 2 inputs and 1 output, got 3 inputs and 1 output");
}

TEST(KernelFactories, RejectWrongDTypes) {
  KernelCall mixed("mul");
  mixed.input<float>(DType::F32, {2}, {1, 2}).input<double>(DType::F64, {2}, {1, 2}).output(DType::F32, {2});
  EXPECT_EQ(factoryError(mixed), "step 0 (mul): input b has dtype f64, expected f32");

  KernelCall integer("exp");
  integer.input<int32_t>(DType::I32, {2}, {1, 2}).output(DType::I32, {2});
  EXPECT_EQ(factoryError(integer), "step 0 (exp): input x has dtype i32, expected f32 or f64");

  KernelCall narrowing("cast");
  narrowing.input<float>(DType::F32, {1}, {1}).output(DType::I32, {1});
  EXPECT_EQ(factoryError(narrowing), "step 0 (cast): cast from f32 to i32 is not supported (float to integer)");

  KernelCall gatherIds("gather", {{"row_offset", 0}});
  gatherIds.input<float>(DType::F32, {2, 1}, {1, 2}).input<float>(DType::F32, {1}, {0}).output(DType::F32, {1, 1});
  EXPECT_EQ(factoryError(gatherIds), "step 0 (gather): input ids has dtype f32, expected i32 or i64");
}

TEST(KernelFactories, RejectBadShapes) {
  KernelCall incompatible("add");
  incompatible.input(DType::F32, {2, 3}, std::vector<float>(6)).input(DType::F32, {4}, std::vector<float>(4));
  incompatible.output(DType::F32, {2, 3});
  EXPECT_EQ(factoryError(incompatible), "step 0 (add): inputs a [2,3] and b [4] do not broadcast");

  KernelCall wrongOutput("sub");
  wrongOutput.input<float>(DType::F32, {2, 1}, {1, 2}).input<float>(DType::F32, {3}, {1, 2, 3});
  wrongOutput.output(DType::F32, {2, 1});
  EXPECT_EQ(factoryError(wrongOutput), "step 0 (sub): output c has shape [2,1], expected [2,3]");

  KernelCall contraction("matmul", {{"transpose_a", false}, {"transpose_b", true}});
  contraction.input(DType::F32, {2, 3}, std::vector<float>(6)).input(DType::F32, {3, 4}, std::vector<float>(12));
  contraction.output(DType::F32, {2, 3});
  EXPECT_EQ(factoryError(contraction), "step 0 (matmul): contraction mismatch: a [2,3] has K=3, b [3,4] has K=4");

  KernelCall batch("matmul", {{"transpose_a", false}, {"transpose_b", false}});
  batch.input(DType::F32, {2, 2, 3}, std::vector<float>(12)).input(DType::F32, {3, 3, 4}, std::vector<float>(36));
  batch.output(DType::F32, {2, 2, 4});
  EXPECT_EQ(factoryError(batch),
            "step 0 (matmul): input b has shape [3,3,4], expected rank 2 or a's batch dims [2] followed by two dims");

  KernelCall weight("rms_norm", {{"eps", 1e-6}});
  weight.input<float>(DType::F32, {2, 3}, std::vector<float>(6)).input<float>(DType::F32, {2}, {1, 1});
  weight.output(DType::F32, {2, 3});
  EXPECT_EQ(factoryError(weight), "step 0 (rms_norm): input w has shape [2], expected [3]");

  KernelCall reshape("reshape");
  reshape.input<float>(DType::F32, {2, 3}, std::vector<float>(6)).output(DType::F32, {5});
  EXPECT_EQ(factoryError(reshape), "step 0 (reshape): output y [5] and input x [2,3] differ in element count");
}

TEST(KernelFactories, RejectMissingOrInvalidAttributes) {
  KernelCall missingEps("rms_norm");
  missingEps.input<float>(DType::F32, {3}, {1, 2, 3}).output(DType::F32, {3});
  EXPECT_EQ(factoryError(missingEps), "step 0 (rms_norm): attribute 'eps' is missing");

  KernelCall axis("softmax", {{"axis", 2}});
  axis.input<float>(DType::F32, {2, 3}, std::vector<float>(6)).output(DType::F32, {2, 3});
  EXPECT_EQ(factoryError(axis), "step 0 (softmax): attribute 'axis': 2 is out of range for input x [2,3]");

  KernelCall dims("reduce_sum", {{"dims", {1, 0}}, {"keep_dims", false}});
  dims.input<float>(DType::F32, {2, 3}, std::vector<float>(6)).output(DType::F32, {});
  EXPECT_EQ(factoryError(dims),
            "step 0 (reduce_sum): attribute 'dims': expected distinct dimensions of input x [2,3] in increasing order, "
            "got [1,0]");

  KernelCall perm("transpose", {{"perm", {0, 0}}});
  perm.input<float>(DType::F32, {2, 3}, std::vector<float>(6)).output(DType::F32, {2, 3});
  EXPECT_EQ(factoryError(perm),
            "step 0 (transpose): attribute 'perm': [0,0] is not a permutation of the 2 dims of input x");

  KernelCall flag("matmul", {{"transpose_a", 1}});
  flag.input<float>(DType::F32, {1, 1}, {1}).input<float>(DType::F32, {1, 1}, {1}).output(DType::F32, {1, 1});
  EXPECT_EQ(factoryError(flag), "step 0 (matmul): attribute 'transpose_a': expected a boolean");

  KernelCall stream("random_uniform", {{"stream", -1}});
  stream.input<int64_t>(DType::I64, {2}, {1, 2}).output(DType::F32, {4});
  EXPECT_EQ(factoryError(stream),
            "step 0 (random_uniform): attribute 'stream': expected an integer in [0, 2^32), got -1");

  KernelCall fill("fill", {{"value", 0.5}});
  fill.output(DType::I32, {4});
  EXPECT_EQ(factoryError(fill), "step 0 (fill): attribute 'value': 0.500000 is not representable in i32");
}

}  // namespace
}  // namespace dgemma::test
