// The pre-training objectives (docs/pretraining.md, "Objectives") through the compiled plan
// (`dgemma-compile --mode train --objective autoregressive|masked-diffusion|block-diffusion --seq-len 24`, run
// in-process by the session) against torch autograd in float64 over HF's text stack with explicit
// document masks (test/fixtures/diffusion_gemma_pretrain, from
// tools/reference/make_pretraining_fixtures.py): packed rows of 2 and 3 documents, documents longer
// than the sliding window, padding, fp32 plans on the all_experts fixture. The loss within 1e-6
// relative, every parameter gradient ‖Δ‖/‖ref‖ <= 1e-5. The masked-diffusion step's own draws
// (p_mask, the masked positions and ids, the fallback row that the draw left unmasked) equal the
// reference's, which are docs/kernels.md's Philox uniforms written out in Python, and so do the
// block-diffusion step's (t per row and block, the replaced ids). Below, a packed
// row against its documents alone, and every parallel layout against one rank through
// `dgemma-run grad`.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/session/Session.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr double kLossTolerance = 1e-6;
constexpr double kGradientTolerance = 1e-5;
const std::string kGradientPrefix = "grad/";
const std::string kFixtureRoot = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/";

std::vector<double> toDoubles(const HostTensor& tensor, const std::string& what) {
  const HostTensor wide = convertDType(tensor, DType::F64, what);
  return std::vector<double>(wide.as<double>(), wide.as<double>() + wide.numElements());
}

std::vector<int64_t> toInts(const HostTensor& tensor) {
  EXPECT_EQ(tensor.dtype, DType::I64);
  return std::vector<int64_t>(tensor.as<int64_t>(), tensor.as<int64_t>() + tensor.numElements());
}

nlohmann::json readJson(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << path;
  return nlohmann::json::parse(file);
}

std::map<std::string, HostTensor> readAll(const std::string& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, HostTensor> tensors;
  for (const SafetensorsEntry& entry : file.entries()) tensors[entry.name] = file.read(entry.name);
  return tensors;
}

class DiffusionGemmaPretrainingParity : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string fixtureDir = kFixtureRoot + "diffusion_gemma_pretrain/all_experts";
  const std::string modelDir = kFixtureRoot + "diffusion_gemma/all_experts";
  ScratchDirectory dir;
};

TEST_P(DiffusionGemmaPretrainingParity, MatchesTorchAutograd) {
  const std::string objective = GetParam();
  const nlohmann::json meta = readJson(fixtureDir + "/meta.json");
  const std::string flags = meta.at("cases").at(objective).at("flags").get<std::string>();
  const std::string inputPath = fixtureDir + "/" + objective + ".input.safetensors";
  const std::map<std::string, HostTensor> batch = readAll(inputPath);
  const std::map<std::string, HostTensor> expected = readAll(fixtureDir + "/" + objective + ".safetensors");
  const HostTensor& inputIds = batch.at("input_ids");

  const std::string plan = dir / "plan";
  testing::ToolResult compiled =
      runTool(std::string(DGEMMA_COMPILE) + " --model " + modelDir + " --mode train " + flags + " --micro-batch " +
              std::to_string(inputIds.shape[0]) + " --seq-len " + std::to_string(inputIds.shape[1]) + " -o " + plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  SessionOptions options;
  options.planDir = plan;
  options.weights = modelDir + "/model.safetensors";
  options.threads = 2;
  std::unique_ptr<Session> session = openSession(options);
  const std::map<std::string, HostTensor> outputs = runEntry(*session, "train_step", batch, inputPath);

  const double loss = toDoubles(outputs.at("loss"), "loss").at(0);
  const double referenceLoss = toDoubles(expected.at("loss"), "reference loss").at(0);
  EXPECT_LE(std::abs(loss - referenceLoss) / std::abs(referenceLoss), kLossTolerance)
      << "loss " << loss << " vs " << referenceLoss;

  if (objective == "masked-diffusion") {
    // The draws are exact: the same Philox words, compared in the same float32 arithmetic.
    EXPECT_EQ(toDoubles(outputs.at("p_mask"), "p_mask"), toDoubles(expected.at("p_mask"), "reference p_mask"));
    EXPECT_EQ(toDoubles(outputs.at("masked_positions"), "masked_positions"),
              toDoubles(expected.at("masked_positions"), "reference masked_positions"));
    EXPECT_EQ(toInts(outputs.at("masked_input_ids")), toInts(expected.at("masked_input_ids")));
    ASSERT_EQ(meta.at("cases").at(objective).at("fallback_rows"), nlohmann::json::array({2}))
        << "the fixture must exercise the at-least-one-masked-token fallback";
  }
  if (objective == "block-diffusion") {
    // The SFT corruption per block: t per (row, block) and the replaced ids, from the same Philox words.
    EXPECT_EQ(toDoubles(outputs.at("diffusion_t"), "diffusion_t"),
              toDoubles(expected.at("diffusion_t"), "reference diffusion_t"));
    const std::vector<int64_t> noisy = toInts(outputs.at("noisy_canvas_ids"));
    EXPECT_EQ(noisy, toInts(expected.at("noisy_canvas_ids")));
    EXPECT_NE(noisy, toInts(inputIds)) << "the fixture's draw must replace some tokens";
    ASSERT_EQ(outputs.at("diffusion_t").shape, (std::vector<int64_t>{inputIds.shape[0], 3}))
        << "three blocks of the canvas length 8 per row of 24";
  }

  std::set<std::string> planGradients;
  for (const Parameter& parameter : session->plan.parameters) {
    if (parameter.name.rfind(kGradientPrefix, 0) != 0) continue;
    planGradients.insert(parameter.name);
    ASSERT_TRUE(expected.count(parameter.name)) << parameter.name << " has no reference";
    const std::vector<double> got = toDoubles(session->executor->parameter(parameter.name), parameter.name);
    const std::vector<double> want = toDoubles(expected.at(parameter.name), "reference " + parameter.name);
    ASSERT_EQ(got.size(), want.size()) << parameter.name;
    double difference = 0, reference = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      difference += (got[i] - want[i]) * (got[i] - want[i]);
      reference += want[i] * want[i];
    }
    // A gradient that is exactly zero in the reference (the pad row's embedding) must be zero here too.
    if (reference == 0) {
      EXPECT_EQ(difference, 0) << parameter.name;
      continue;
    }
    EXPECT_LE(std::sqrt(difference / reference), kGradientTolerance) << parameter.name;
  }
  // The parameters the objective does not read (the decoder's self-conditioning block) have no
  // gradient buffer; the reference's gradient of each is exactly zero. Every other one was compared.
  int64_t unused = 0;
  for (const auto& [name, tensor] : expected) {
    if (name.rfind(kGradientPrefix, 0) != 0 || planGradients.count(name)) continue;
    ++unused;
    EXPECT_NE(name.find("self_conditioning"), std::string::npos) << name << ": no gradient buffer in the plan";
    for (double value : toDoubles(tensor, name)) ASSERT_EQ(value, 0.0) << name;
  }
  EXPECT_EQ(unused, 4) << "the self-conditioning block: pre_norm, gate_proj, up_proj, down_proj";
  EXPECT_GT(planGradients.size(), 60u);
}

// Document masking without the reference: a packed row of three documents (5, 11 and 8 tokens; the
// 11-token one crosses the sliding window) gives the loss and every gradient of the same documents
// each alone in a row of its own (the rest of the row padding), since attention never crosses a
// document and positions restart in each: the same scored tokens with the same CE, summed in
// another order.
TEST(DiffusionGemmaPretrainingPacking, AutoregressiveRowEqualsItsDocumentsAlone) {
  constexpr int64_t kLength = 24;
  const std::vector<int64_t> lengths = {5, 11, 8};
  const int64_t documents = static_cast<int64_t>(lengths.size());
  auto tokenOf = [](int64_t document, int64_t index) { return 1 + (11 * index + 5 * document + 3) % 62; };
  // Rows of the batch as (document, first position) per document: all in row 0, or one per row.
  auto batchOf = [&](bool packed) {
    const int64_t rows = packed ? 1 : documents;
    HostTensor ids(DType::I64, {rows, kLength}), positions(DType::I64, {rows, kLength});
    HostTensor documentIds(DType::I64, {rows, kLength}), labels(DType::I64, {rows, kLength});
    HostTensor lossMask(DType::F32, {rows, kLength});
    for (int64_t at = 0; at < rows * kLength; ++at) {  // padding everywhere first: a document of its own
      ids.as<int64_t>()[at] = 0;
      positions.as<int64_t>()[at] = at % kLength;
      documentIds.as<int64_t>()[at] = -1;
      labels.as<int64_t>()[at] = 0;
      lossMask.as<float>()[at] = 0.0f;
    }
    int64_t start = 0;
    for (int64_t document = 0; document < documents; ++document) {
      const int64_t row = packed ? 0 : document, first = packed ? start : 0;
      for (int64_t index = 0; index < lengths[document]; ++index) {
        const int64_t at = row * kLength + first + index;
        ids.as<int64_t>()[at] = tokenOf(document, index);
        positions.as<int64_t>()[at] = index;
        documentIds.as<int64_t>()[at] = document;
        if (index + 1 < lengths[document]) {
          labels.as<int64_t>()[at] = tokenOf(document, index + 1);
          lossMask.as<float>()[at] = 1.0f;
        }
      }
      start += lengths[document];
    }
    return std::map<std::string, HostTensor>{{"input_ids", ids},
                                             {"position_ids", positions},
                                             {"document_ids", documentIds},
                                             {"labels", labels},
                                             {"loss_mask", lossMask}};
  };
  ScratchDirectory dir;
  const std::string model = kFixtureRoot + "diffusion_gemma/all_experts";
  auto lossAndGradients = [&](bool packed) {
    const std::string plan = dir / (packed ? "packed" : "alone");
    testing::ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode train --objective autoregressive " +
                "--seq-len 24 --micro-batch " + std::to_string(packed ? 1 : documents) + " -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    SessionOptions options;
    options.planDir = plan;
    options.weights = model + "/model.safetensors";
    options.threads = 2;
    std::unique_ptr<Session> session = openSession(options);
    std::map<std::string, std::vector<double>> values;
    values["loss"] = toDoubles(runEntry(*session, "train_step", batchOf(packed), plan).at("loss"), "loss");
    for (const Parameter& parameter : session->plan.parameters)
      if (parameter.name.rfind(kGradientPrefix, 0) == 0)
        values[parameter.name] = toDoubles(session->executor->parameter(parameter.name), parameter.name);
    return values;
  };
  const std::map<std::string, std::vector<double>> packed = lossAndGradients(true);
  const std::map<std::string, std::vector<double>> alone = lossAndGradients(false);
  ASSERT_EQ(packed.size(), alone.size());
  for (const auto& [name, want] : alone) {
    const std::vector<double>& got = packed.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double difference = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      difference += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    const double tolerance = name == "loss" ? kLossTolerance : kGradientTolerance;
    EXPECT_LE(norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference), tolerance) << name;
  }
}

// Every parallel layout and recompute policy computes what one rank computes (docs/parallelism.md)
// for the three objectives (block diffusion in blocks of 8, three a row):
// `dgemma-run grad` on per-rank plans of tiny-cpu (randomly initialised; its KV heads split 2 ways)
// against the one-rank plan, on two packed rows (documents of 5, 11 and 8 tokens; of 14 and 6 and 4
// of padding) that cross the sliding window (8). The loss within 1e-6, every gradient within 1e-5
// (‖Δ‖/‖one rank‖).
struct Layout {
  std::string name;
  std::string flags;  // dgemma-compile's layout flags
  int64_t ranks;
  int64_t dataParallel;
};

struct ShardedCase {
  std::string objective;
  Layout layout;
};

void PrintTo(const ShardedCase& c, std::ostream* out) { *out << c.objective << " " << c.layout.name; }

class DiffusionGemmaPretrainingSharded : public ::testing::TestWithParam<ShardedCase> {
 protected:
  // The packed batch of two rows and its objective's inputs, written where `dgemma-run grad` reads it.
  std::string writeBatch(const std::string& objective) {
    constexpr int64_t kRows = 2, kLength = 24, kVocab = 256;
    const std::vector<std::vector<int64_t>> documents = {{5, 11, 8}, {14, 6}};
    HostTensor ids(DType::I64, {kRows, kLength}), positions(DType::I64, {kRows, kLength});
    HostTensor documentIds(DType::I64, {kRows, kLength}), real(DType::F32, {kRows, kLength});
    HostTensor labels(DType::I64, {kRows, kLength}), nextToken(DType::F32, {kRows, kLength});
    for (int64_t row = 0; row < kRows; ++row) {
      int64_t position = 0;
      for (int64_t document = 0; document < static_cast<int64_t>(documents[row].size()); ++document)
        for (int64_t index = 0; index < documents[row][document]; ++index, ++position) {
          const int64_t at = row * kLength + position;
          ids.as<int64_t>()[at] = 1 + (7 * position + 13 * row + 3 * document) % (kVocab - 2);
          positions.as<int64_t>()[at] = index;
          documentIds.as<int64_t>()[at] = document;
          real.as<float>()[at] = 1.0f;
        }
      for (int64_t pad = 0; position < kLength; ++position, ++pad) {  // padding: a document of its own
        const int64_t at = row * kLength + position;
        ids.as<int64_t>()[at] = 0;
        positions.as<int64_t>()[at] = pad;
        documentIds.as<int64_t>()[at] = -1;
        real.as<float>()[at] = 0.0f;
      }
      for (int64_t position = 0; position < kLength; ++position) {
        const int64_t at = row * kLength + position;
        const bool scored = position + 1 < kLength && real.as<float>()[at] > 0 && real.as<float>()[at + 1] > 0 &&
                            documentIds.as<int64_t>()[at] == documentIds.as<int64_t>()[at + 1];
        labels.as<int64_t>()[at] = scored ? ids.as<int64_t>()[at + 1] : 0;
        nextToken.as<float>()[at] = scored ? 1.0f : 0.0f;
      }
    }
    HostTensor keys(DType::I64, {kRows, 2});
    for (int64_t index = 0; index < 2 * kRows; ++index) keys.as<int64_t>()[index] = 1000 + 17 * index;
    std::vector<std::pair<std::string, const HostTensor*>> tensors = {
        {"input_ids", &ids}, {"position_ids", &positions}, {"document_ids", &documentIds}};
    if (objective == "autoregressive") {
      tensors.push_back({"labels", &labels});
      tensors.push_back({"loss_mask", &nextToken});
    } else {
      tensors.push_back({"loss_mask", &real});
      tensors.push_back({"noise_keys", &keys});
    }
    const std::string path = dir / "batch.safetensors";
    writeSafetensors(path, tensors);
    return path;
  }

  void compile(const std::string& flags, const std::string& out) {
    testing::ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + std::string(DGEMMA_SOURCE_DIR) +
                "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --seq-len 24 " + flags + " -o " + out);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
  }

  void grad(const std::string& plan, const std::string& batch, const std::string& out, int64_t ranks) {
    testing::ToolResult ran =
        runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + " --init random --seed 3 --input " + batch +
                " --out " + out + " --nproc-per-node " + std::to_string(ranks));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
  }

  ScratchDirectory dir;
};

TEST_P(DiffusionGemmaPretrainingSharded, EqualsOneRank) {
  const ShardedCase& c = GetParam();
  const std::string objective = "--objective " + c.objective +
                                (c.objective == "masked-diffusion"  ? " --mask-token-id 255"
                                 : c.objective == "block-diffusion" ? " --canvas-len 8"
                                                                    : "");
  const std::string batch = writeBatch(c.objective);
  compile(objective + " --micro-batch 2", dir / "one");
  compile(objective + " --micro-batch " + std::to_string(2 / c.layout.dataParallel) + " " + c.layout.flags,
          dir / "sharded");
  grad(dir / "one", batch, dir / "one.safetensors", 1);
  grad(dir / "sharded", batch, dir / "sharded.safetensors", c.layout.ranks);
  if (HasFailure()) return;

  const std::map<std::string, HostTensor> want = readAll(dir / "one.safetensors");
  const std::map<std::string, HostTensor> got = readAll(dir / "sharded.safetensors");
  int64_t compared = 0;
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name << ": missing from the sharded run's output";
    if (tensor.dtype == DType::I64) {  // the masked or noisy ids: the same draws on every layout
      EXPECT_EQ(toInts(got.at(name)), toInts(tensor)) << name;
      continue;
    }
    const std::vector<double> a = toDoubles(got.at(name), name), b = toDoubles(tensor, name);
    ASSERT_EQ(a.size(), b.size()) << name;
    double difference = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      difference += (a[i] - b[i]) * (a[i] - b[i]);
      norm += b[i] * b[i];
    }
    const double tolerance = name == "loss" ? kLossTolerance : kGradientTolerance;
    EXPECT_LE(norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference), tolerance) << name;
    ++compared;
  }
  EXPECT_GE(compared, 44);  // the loss (and p_mask, masked_positions) and tiny-cpu's 43 trainable parameters' gradients
  EXPECT_TRUE(want.count("loss"));
}

std::vector<ShardedCase> shardedCases() {
  const std::vector<Layout> layouts = {{"tp2", "--tp 2", 2, 1},
                                       {"tp2_sp", "--tp 2 --sp", 2, 1},
                                       {"dp2", "--dp 2", 2, 2},
                                       {"dp2_ep2", "--dp 2 --ep 2", 2, 2},
                                       {"tp2_sp_recompute_full", "--tp 2 --sp --recompute full", 2, 1},
                                       {"dp2_ep2_recompute_selective", "--dp 2 --ep 2 --recompute selective", 2, 2}};
  std::vector<ShardedCase> cases;
  for (const char* objective : {"autoregressive", "masked-diffusion", "block-diffusion"})
    for (const Layout& layout : layouts) cases.push_back({objective, layout});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, DiffusionGemmaPretrainingSharded, ::testing::ValuesIn(shardedCases()),
                         [](const ::testing::TestParamInfo<ShardedCase>& info) {
                           std::string name = info.param.objective + "_" + info.param.layout.name;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

INSTANTIATE_TEST_SUITE_P(Objectives, DiffusionGemmaPretrainingParity,
                         ::testing::Values("autoregressive", "masked-diffusion", "block-diffusion"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace dgemma
