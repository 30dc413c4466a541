// Times CPU kernels through the same registry the executor uses and prints a table:
// effective GFLOP/s for GEMMs, GB/s (bytes read + written) for memory-bound kernels, and million
// vocabulary entries per second for the sampler (its cost is the noise and the exps, not the bytes).
// "cpu ms" is the process's CPU time (all threads) per run, which other load on a shared machine
// moves much less than the wall-clock "ms".
//   dgemma-bench-cpu-kernels [--threads N] [--repeats R] [--filter TEXT] [--dump-outputs DIR]
// --filter runs only the cases whose label holds TEXT; --dump-outputs writes each case's outputs
// after the last run to DIR/<label>, so that two builds can be compared bit for bit (cmp).
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernel_api/Backend.h"
#include "runtime/core/HostTensor.h"

namespace {

using namespace dgemma;

// A buffer of the case; f32 inputs are filled uniformly from [low, high), i64 inputs with integers
// in [0, indexBound), u8 inputs (attention's key_valid) with ones.
struct Tensor {
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  float low = -1.0f, high = 1.0f;
  int64_t indexBound = 1024;  // i64 inputs are drawn from [0, indexBound)
};

enum class Rate { Flops, Bytes, Entries };

struct Case {
  std::string label;
  std::string kernel;
  nlohmann::json attrs;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  Rate rate = Rate::Bytes;
  double work = 0;  // FLOPs or entries; the bytes are counted from the buffers
};

double processCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

void dumpOutputs(const std::string& directory, const Case& spec, const std::vector<HostTensor>& storage) {
  std::string name = spec.label;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  std::ofstream file(directory + "/" + name, std::ios::binary);
  for (size_t i = spec.inputs.size(); i < storage.size(); ++i)
    file.write(reinterpret_cast<const char*>(storage[i].data.data()), static_cast<std::streamsize>(storage[i].data.size()));
  if (!file) throw std::runtime_error("cannot write " + directory + "/" + name);
}

double timeCase(Backend& backend, const Case& spec, int repeats, const std::string& dumpDirectory, double& bytesMoved,
                double& cpuSeconds) {
  Step step;
  step.op = spec.kernel;
  step.attrs = spec.attrs;
  std::vector<Tensor> tensors = spec.inputs;
  tensors.insert(tensors.end(), spec.outputs.begin(), spec.outputs.end());
  std::vector<Buffer> buffers;
  for (const Tensor& tensor : tensors) buffers.push_back({int64_t(buffers.size()), "buffer", tensor.dtype, tensor.shape, 0, 0, {}, {}});

  KernelSignature signature;
  signature.step = &step;
  signature.where = spec.label;
  for (size_t i = 0; i < buffers.size(); ++i) (i < spec.inputs.size() ? signature.inputs : signature.outputs).push_back(&buffers[i]);
  std::unique_ptr<Kernel> kernel = (*backend.kernels().find(spec.kernel))(signature);

  std::mt19937 rng(0);
  std::vector<HostTensor> storage;
  std::vector<TensorRef> inputs, outputs;
  bytesMoved = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    storage.emplace_back(tensors[t].dtype, tensors[t].shape);
    std::uniform_real_distribution<float> uniform(tensors[t].low, tensors[t].high);
    for (int64_t i = 0; i < storage.back().numElements(); ++i) {
      if (tensors[t].dtype == DType::F32) storage.back().as<float>()[i] = uniform(rng);
      else if (tensors[t].dtype == DType::I64) storage.back().as<int64_t>()[i] = static_cast<int64_t>(rng() % tensors[t].indexBound);
      else if (tensors[t].dtype == DType::U8) storage.back().as<uint8_t>()[i] = 1;
    }
    bytesMoved += static_cast<double>(buffers[t].bytes());
  }
  for (size_t i = 0; i < buffers.size(); ++i)
    (i < spec.inputs.size() ? inputs : outputs).push_back({storage[i].data.data(), &buffers[i]});

  ExecContext context = backend.context(0);
  kernel->run(context, inputs, outputs);  // warm-up: page in, spin up threads
  auto start = std::chrono::steady_clock::now();
  const double cpuStart = processCpuSeconds();
  for (int r = 0; r < repeats; ++r) kernel->run(context, inputs, outputs);
  cpuSeconds = (processCpuSeconds() - cpuStart) / repeats;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
  if (!dumpDirectory.empty()) dumpOutputs(dumpDirectory, spec, storage);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t threads = 0;
  int repeats = 10;
  std::string filter, dumpDirectory;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--filter")) filter = argv[i + 1];
    else if (!std::strcmp(argv[i], "--dump-outputs")) dumpDirectory = argv[i + 1];
  }
  std::unique_ptr<Backend> backend = createBackend("cpu", threads);
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json untransposed = {{"transpose_a", false}, {"transpose_b", false}};
  // canvas_sample at one canvas of L = 256 over V = 4096: logits in [-8, 8) (flat enough that few
  // entries' noise is skipped), temperatures in the schedule's [0.4, 0.8].
  const Case canvasSample{
      "canvas_sample [1,256,4096] ->bf16",
      "canvas_sample",
      {{"softcap", 0.0}},
      {{{1, 256, 4096}, DType::F32, -8.0f, 8.0f}, {{1}, DType::F32, 0.4f, 0.8f}, {{1, 2}, DType::I64}},
      {{{1, 256}, DType::I64}, {{1, 256}, DType::I64}, {{1, 256}}, {{1, 256, 4096}, DType::BF16}},
      Rate::Entries,
      256.0 * 4096};
  // attention at the small-20m training step's shapes: 4 query heads on 2 KV heads of 64, Tk = 128,
  // every key valid. The rate counts the useful FLOPs, those of the visible (query, key) pairs: the
  // forward's two products (scores, p·v), 2·(D + Dv) each, and the backward's five (scores again,
  // dp, dq, dk, dv), 2·(3·D + 2·Dv). Sliding layers: the last 64 positions, window 64, each sees
  // 64 keys; full layers: 128 causal queries; the prefix mask: 64 queries each seeing all 128 keys.
  auto attentionCases = [](const std::string& name, nlohmann::json attrs, int64_t queries, double visiblePairs) {
    const std::vector<Tensor> forwardInputs = {
        {{4, queries, 4, 64}}, {{4, 128, 2, 64}}, {{4, 128, 2, 64}}, {{4, 128}, DType::U8}};
    std::vector<Tensor> backwardInputs = forwardInputs;
    backwardInputs.push_back({{4, queries, 4, 64}});
    const std::string shapes = " q[4," + std::to_string(queries) + ",4,64] kv[4,128,2,64]";
    return std::vector<Case>{
        {"attention " + name + shapes, "attention", attrs, forwardInputs, {{{4, queries, 4, 64}}}, Rate::Flops,
         visiblePairs * 2 * (64 + 64)},
        {"attention_backward " + name + shapes, "attention_backward", attrs, backwardInputs,
         {{{4, queries, 4, 64}}, {{4, 128, 2, 64}}, {{4, 128, 2, 64}}}, Rate::Flops, visiblePairs * 2 * (3 * 64 + 2 * 64)}};
  };
  const double headRows = 4 * 4;  // batch × query heads
  const std::vector<Case> slidingAttention = attentionCases(
      "causal w64", {{"mask", "causal"}, {"window", 64}, {"prefix_len", 0}, {"scale", 0.125}}, 64, headRows * 64 * 64);
  const std::vector<Case> causalAttention =
      attentionCases("causal", {{"mask", "causal"}, {"window", 0}, {"prefix_len", 0}, {"scale", 0.125}}, 128,
                     headRows * 128 * 129 / 2);
  // moe_experts at the small-20m training step's shapes: 8 experts of 2 × 256 (gate, up) and 256, top-2
  // routes of 512 tokens (the clean pass; the decoder's calls have 256), expert ids uniform. The
  // rate counts the products: forward 2·H·(2I + I) per route; backward five products, 2·H·(3·2I + 2·I).
  // "kept": the forward also writing gate_up_rows [N·k, 2I], and the backward reading them instead of
  // its gate/up product, four products, 2·H·(2·2I + 2·I).
  auto moeCases = [](int64_t tokens) {
    const nlohmann::json inFirstBlock = {{"expert_offset", 0}};  // every expert local
    const double routes = double(tokens) * 2, h = 256, i = 256;
    const Tensor x{{tokens, 256}}, weights{{tokens, 2}, DType::F32, 0.0f, 1.0f}, indices{{tokens, 2}, DType::I64, 0, 0, 8};
    const Tensor gateUp{{8, 512, 256}, DType::F32, -0.05f, 0.05f}, down{{8, 256, 256}, DType::F32, -0.05f, 0.05f};
    const std::string shape = " [" + std::to_string(tokens) + ",256] top-2 of 8";
    return std::vector<Case>{{"moe_experts" + shape,
                              "moe_experts",
                              inFirstBlock,
                              {x, weights, indices, gateUp, down},
                              {{{tokens, 256}}},
                              Rate::Flops,
                              routes * 2 * h * (2 * i + i)},
                             {"moe_experts_backward" + shape,
                              "moe_experts_backward",
                              inFirstBlock,
                              {x, weights, indices, gateUp, down, {{tokens, 256}}},
                              {{{tokens, 256}}, {{tokens, 2}}, {{8, 512, 256}}, {{8, 256, 256}}},
                              Rate::Flops,
                              routes * 2 * h * (3 * 2 * i + 2 * i)},
                             {"moe_experts" + shape + " kept",
                              "moe_experts",
                              inFirstBlock,
                              {x, weights, indices, gateUp, down},
                              {{{tokens, 256}}, {{tokens * 2, 512}}},
                              Rate::Flops,
                              routes * 2 * h * (2 * i + i)},
                             {"moe_experts_backward" + shape + " kept",
                              "moe_experts_backward",
                              inFirstBlock,
                              {x, weights, indices, gateUp, down, {{tokens, 256}}, {{tokens * 2, 512}}},
                              {{{tokens, 256}}, {{tokens, 2}}, {{8, 512, 256}}, {{8, 256, 256}}},
                              Rate::Flops,
                              routes * 2 * h * (2 * 2 * i + 2 * i)}};
  };
  const std::vector<Case> moe512 = moeCases(512), moe256 = moeCases(256);
  const std::vector<Case> prefixAttention = attentionCases(
      "prefix 64", {{"mask", "prefix"}, {"window", 0}, {"prefix_len", 64}, {"scale", 0.125}}, 64, headRows * 64 * 128);
  const std::vector<Case> cases = {
      {"matmul 512x512x512",
       "matmul",
       untransposed,
       {{{512, 512}}, {{512, 512}}},
       {{{512, 512}}},
       Rate::Flops,
       2.0 * 512 * 512 * 512},
      {"matmul [4,256,1024]x[1024,1024]",
       "matmul",
       untransposed,
       {{{4, 256, 1024}}, {{1024, 1024}}},
       {{{4, 256, 1024}}},
       Rate::Flops,
       2.0 * 4 * 256 * 1024 * 1024},
      {"rms_norm 4096x2816 +w", "rms_norm", {{"eps", 1e-6}}, {{{4096, 2816}}, {{2816}}}, {{{4096, 2816}}}},
      // The training step's row kernels at small-20m's shapes (B·L = 256 rows, H = 256, V = 16384).
      {"cross_entropy_bwd [256,16384] cap",
       "cross_entropy_backward",
       {{"softcap", 30.0}},
       {{{256, 16384}, DType::F32, -8.0f, 8.0f}, {{256}, DType::I64}, {{256}}},
       {{{256, 16384}}}},
      {"cross_entropy [256,16384] cap",
       "cross_entropy",
       {{"softcap", 30.0}},
       {{{256, 16384}, DType::F32, -8.0f, 8.0f}, {{256}, DType::I64}},
       {{{256}}}},
      {"rms_norm_bwd [256,256] +w",
       "rms_norm_backward",
       {{"eps", 1e-6}},
       {{{256, 256}}, {{256, 256}}, {{256}}},
       {{{256, 256}}, {{256}}}},
      {"rms_norm [256,256] +w", "rms_norm", {{"eps", 1e-6}}, {{{256, 256}}, {{256}}}, {{{256, 256}}}},
      {"add [256,256]+[256,256]", "add", none, {{{256, 256}}, {{256, 256}}}, {{{256, 256}}}},
      {"add [16384,256]+[16384,256]", "add", none, {{{16384, 256}}, {{16384, 256}}}, {{{16384, 256}}}},
      {"softmax [256,16384]", "softmax", {{"axis", -1}}, {{{256, 16384}}}, {{{256, 16384}}}},
      // gelu_tanh's derivative times dy as dg-fuse-elementwise chains it: x, dy and five scalars.
      {"fused gelu' [256,512] 5 scalars",
       "fused_elementwise",
       {{"program",
         "mul f32 0 0; mul f32 7 0; mul f32 8 5; add f32 0 9; mul f32 10 4; tanh f32 11; mul f32 12 12; "
         "sub f32 3 13; mul f32 7 5; mul f32 15 6; add f32 3 16; mul f32 17 4; mul f32 14 18; mul f32 0 19; "
         "add f32 3 12; add f32 21 20; mul f32 22 2; mul f32 23 1"}},
       {{{256, 512}}, {{256, 512}}, {{1}}, {{1}}, {{1}}, {{1}}, {{1}}},
       {{{256, 512}}}},
      {"softmax 1024x4096", "softmax", {{"axis", -1}}, {{{1024, 4096}}}, {{{1024, 4096}}}},
      {"gelu_tanh 4M", "gelu_tanh", none, {{{4 << 20}}}, {{{4 << 20}}}},
      {"add [4096,2816]+[2816]", "add", none, {{{4096, 2816}}, {{2816}}}, {{{4096, 2816}}}},
      canvasSample,
      slidingAttention[0],
      slidingAttention[1],
      causalAttention[0],
      causalAttention[1],
      prefixAttention[0],
      prefixAttention[1],
      moe512[0],
      moe512[1],
      moe512[2],
      moe512[3],
      moe256[0],
      moe256[1],
      moe256[2],
      moe256[3],
  };
  std::printf("%-60s %12s %12s %12s\n", "kernel (cpu)", "ms", "cpu ms", "rate");
  for (const Case& spec : cases) {
    if (spec.label.find(filter) == std::string::npos) continue;
    double bytes = 0, cpuSeconds = 0;
    double seconds = timeCase(*backend, spec, repeats, dumpDirectory, bytes, cpuSeconds);
    std::printf("%-60s %12.3f %12.3f ", spec.label.c_str(), seconds * 1e3, cpuSeconds * 1e3);
    if (spec.rate == Rate::Flops)
      std::printf("%8.1f GFLOP/s\n", spec.work / seconds / 1e9);
    else if (spec.rate == Rate::Entries)
      std::printf("%8.1f M entries/s\n", spec.work / seconds / 1e6);
    else
      std::printf("%8.1f GB/s\n", bytes / seconds / 1e9);
  }
  return 0;
}
