// The in-memory form of a plan: what one rank executes. Written by dgemma-compile, read by
// dgemma-run. The file format around it is described in docs/plan-format.md; this header is the
// authoritative list of fields.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/Names.h"
#include "plan/OptimizerSettings.h"
#include "support/DType.h"

namespace dgemma {

inline constexpr uint32_t kPlanFormatVersion = 2;

struct MeshAxis {
  std::string name;  // "dp", "tp", "ep", ...
  int64_t size = 1;
  int64_t coord = 0;  // this rank's position along the axis
};

// A contiguous region of memory. Persistent arenas hold parameters and constants for the plan's
// lifetime; the scratch arena is reused by every entry point (only one runs at a time).
struct Arena {
  std::string name;
  bool persistent = false;
  uint64_t bytes = 0;
  uint64_t alignment = 64;
};

// Steps [first, last] of one entry point during which a scratch buffer holds a live value.
struct Lifetime {
  std::string entry;  // entry-point key (see EntryPoint::key)
  int64_t first = 0;
  int64_t last = 0;
};

struct Buffer {
  int64_t id = 0;
  std::string name;  // for diagnostics only
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t arena = 0;  // index into Plan::arenas
  uint64_t offset = 0;
  std::optional<Lifetime> lifetime;  // absent: persistent
  std::optional<int64_t> aliasOf;    // a view (reshape) of another buffer's bytes

  int64_t numElements() const;
  uint64_t bytes() const { return static_cast<uint64_t>(numElements()) * dtypeSize(dtype); }
};

// This rank's slice of a parameter: global shape and the box [offset, offset + shape) it holds.
struct Parameter {
  std::string name;  // HF checkpoint name
  int64_t buffer = 0;
  std::vector<int64_t> globalShape;
  std::vector<int64_t> shardOffset;
  std::vector<int64_t> shardShape;
  bool trainable = true;
  // The buffer holds this rank's share of a pending sum (a gradient buffer under data parallelism):
  // the tensor is the sum over the ranks of the boxes they hold.
  bool pendingSum = false;
  nlohmann::json init;  // {"kind": "normal", "std": 0.02} / {"kind": "ones"} / ...
};

// Initial contents of a persistent buffer, stored in a binary section.
struct Constant {
  int64_t buffer = 0;
  int64_t section = 0;
  uint64_t offset = 0;  // within the section
  uint64_t bytes = 0;
};

struct BinarySection {
  std::string name;
  std::vector<uint8_t> data;
};

// One entry in an entry point's ordered step list: a kernel launch or a collective.
struct Step {
  enum class Kind { Kernel, Collective };
  Kind kind = Kind::Kernel;
  std::string op;         // kernel name ("matmul") or collective ("all_reduce")
  nlohmann::json attrs = nlohmann::json::object();
  std::vector<int64_t> inputs;   // buffer ids
  std::vector<int64_t> outputs;  // buffer ids
  std::string axis;       // collectives: the mesh axis that forms the group
  int64_t stream = 0;     // execution stream; the CPU backend runs all streams in order
  std::vector<int64_t> waitEvents;    // events this step waits on before starting
  std::vector<int64_t> signalEvents;  // events recorded after this step
  std::string location;   // "file:line:col" of the IR op it came from, for diagnostics
};

// An entry point's input or output. On a sharded plan the buffer may be this rank's box of a larger
// tensor: [shardOffset, shardOffset + the buffer's shape) of globalShape. Both empty: the buffer is
// the whole tensor (every single-rank plan, and values that are whole on every rank).
struct NamedBuffer {
  NamedBuffer() = default;
  NamedBuffer(std::string name, int64_t buffer) : name(std::move(name)), buffer(buffer) {}

  std::string name;
  int64_t buffer = 0;
  std::vector<int64_t> globalShape;
  std::vector<int64_t> shardOffset;

  bool isWhole() const { return globalShape.empty(); }
};

// Plans are shape-specialised: an entry point is compiled for one bucket of dynamic sizes, and a
// plan may carry the same function for several buckets (e.g. prompt lengths 128, 256, 512).
struct EntryPoint {
  std::string name;                     // "forward", "train_step", ...
  std::map<std::string, int64_t> bucket;  // {"micro_batch": 2, "prompt_len": 128, ...}
  std::vector<NamedBuffer> inputs;
  std::vector<NamedBuffer> outputs;
  std::vector<Step> steps;
  int64_t numStreams = 1;
  int64_t numEvents = 0;

  // "forward" for an entry without a bucket, else "forward[micro_batch=2,prompt_len=128]".
  std::string key() const;
};

// The model a plan was built from: what loads its weights and what a training run reads from it.
enum class ModelFamily {
  Builtin,         // a built-in test graph: weights load by parameter name
  DiffusionGemma,  // an HF DiffusionGemma checkpoint: names resolved with the config (docs/model.md)
};
const char* modelFamilyName(ModelFamily family);  // "builtin" | "diffusion_gemma"
std::optional<ModelFamily> parseModelFamily(const std::string& name);

// The padding contract of a bucketed plan: a batch smaller than every bucket of `dimension` runs in
// the smallest one that holds it, its `inputs` left-padded along `axis` with their pad values, and
// the outputs whose names start with one of `outputPrefixes` cropped back.
struct BucketPadding {
  std::string dimension;                    // a bucket dimension, "prompt_len"
  int64_t axis = 1;                         // that dimension's axis in the padded inputs
  std::map<std::string, int64_t> inputs;    // input name -> pad value
  std::vector<std::string> outputPrefixes;  // outputs with that dimension on `axis`
};

// A preset's defaults for the `dgemma-run train` flags the command line leaves unset.
struct RunDefaults {
  std::string preset;                                    // its name, for messages
  nlohmann::json trainFlags = nlohmann::json::object();  // flag name without "--" -> value
};

// A plan compiled with adapters (dgemma-compile --lora; docs/training.md, "LoRA adapters"): the
// base weights are frozen and the trainable parameters are the adapters' A and B matrices. The
// runtime names the adapter files after these settings and checks a loaded adapter against them.
struct AdapterSettings {
  int64_t rank = 0;
  double alpha = 0;                  // the update is (alpha / rank) B A
  double dropout = 0;                // on the adapter's input, training entries only
  std::vector<std::string> targets;  // single projection names (q_proj, ..., experts.down_proj)
  std::string baseDtype;             // how the frozen base is stored: f32 | bf16 | int8 | nf4
};

// The block-diffusion generation settings of an inference plan (`dgemma-compile --mode infer`):
// the sizes the prefill, denoise and commit entries were compiled for and the sampler's defaults,
// from the model's generation_config.json and the defaults of docs/generation.md. The host loop
// (runtime/generate) reads them; docs/inference-plan.md describes the entries.
struct GenerationSettings {
  int64_t canvasLength = 0;   // L: the model's canvas_length, the denoise and commit width
  int64_t maxNewTokens = 0;   // the largest max_new_tokens a run may ask (it sizes the cache)
  // C: full-attention layers' cache slots, maxPromptBucket + ceil(maxNewTokens / L) * L - L (the
  // last canvas is never encoded); sliding layers keep min(C, W - 1).
  int64_t cacheLength = 0;
  int64_t maxDenoisingSteps = 48;
  double entropyBound = 0.1;
  double tMin = 0.4;
  double tMax = 0.8;
  int64_t stabilityThreshold = 1;
  double confidenceThreshold = 0.005;
  std::vector<int64_t> eosTokenIds;  // generation_config's eos_token_id, else config.json's, as a list
  int64_t padTokenId = 0;
};

struct Plan {
  uint32_t version = kPlanFormatVersion;
  std::string producer;
  int64_t rank = 0;
  int64_t worldSize = 1;
  std::vector<MeshAxis> mesh;
  std::vector<Arena> arenas;
  std::vector<Buffer> buffers;  // buffers[i].id == i
  std::vector<Parameter> parameters;
  std::vector<Constant> constants;
  std::vector<BinarySection> sections;
  std::vector<EntryPoint> entryPoints;
  ModelFamily modelFamily = ModelFamily::Builtin;
  nlohmann::json modelConfig;                  // DiffusionGemma: the HF config.json it was built from; else null
  // DiffusionGemma: the generation_config.json beside --model, verbatim; null when there was none.
  // Checkpoints copy it so that they are HF model directories (docs/training.md, "Checkpoints").
  nlohmann::json modelGenerationConfig;
  std::optional<BucketPadding> bucketPadding;  // absent: a batch must match a bucket exactly
  std::optional<OptimizerSettings> optimizer;  // training plans (the optimizer_step entry)
  std::optional<RunDefaults> runDefaults;      // plans compiled with --preset
  std::optional<GenerationSettings> generation;  // inference plans (prefill, denoise, commit)
  std::optional<AdapterSettings> adapter;  // plans compiled with --lora
  // Compile flags and the like, for people: nothing reads it to decide what to do.
  nlohmann::json metadata = nlohmann::json::object();

  // The entry named `name` whose bucket fits `sizes` with the least padding: every bucket dimension
  // must be >= the requested size; among those, the smallest total. nullptr if none fits.
  const EntryPoint* selectEntry(const std::string& name, const std::map<std::string, int64_t>& sizes) const;
};

}  // namespace dgemma
