// The expert-parallel dispatch on the CPU: the routing table (moe_dispatch), the permutation of
// rows to their routes' slots and back with the weighted combine (moe_permute, moe_combine), and a
// rank's experts on the rows it received (moe_local_experts and its backward), one GEMM pair per
// expert over all its rows, as moe_experts runs them (runtime/kernels/moe/cpu.cpp).
#include <climits>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/matmul/CpuGemm.h"
#include "runtime/kernels/moe/ExpertMath.h"
#include "runtime/kernels/moe/ExpertsMath.h"
#include "runtime/kernels/moe_dispatch/Contract.h"
#include "runtime/kernels/moe_dispatch/DispatchTable.h"
#include "support/DType.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using expert_math::geluTanhDerivative;
using cpu::gemm;

// ---------------------------------------------------------------------------------------------
// moe_dispatch: the routing table of DispatchTable.h.

class MoeDispatchKernel final : public Kernel {
 public:
  MoeDispatchKernel(std::string where, MoeDispatchContract contract) : where_(std::move(where)), c_(contract) {}

  void run(ExecContext&, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    moe_dispatch::buildDispatchTable(where_, inputs[0].as<const int64_t>(), c_.tokens, c_.topK, c_.peers,
                                     c_.localExperts, outputs[0].as<int64_t>(), outputs[1].as<int64_t>(),
                                     outputs[2].as<int64_t>());
  }

 private:
  std::string where_;
  MoeDispatchContract c_;
};

std::unique_ptr<Kernel> createMoeDispatchKernel(const KernelSignature& signature) {
  return std::make_unique<MoeDispatchKernel>(signature.where, parseMoeDispatchContract(signature));
}

// ---------------------------------------------------------------------------------------------
// moe_permute and moe_combine

// Both read every slot, so both check that the slots are a permutation of [0, M·k) before touching
// a row: a duplicate would leave a row unwritten, an outside slot address memory it does not own.
void checkPermutation(const std::string& where, const int64_t* slots, int64_t count) {
  std::vector<bool> taken(static_cast<size_t>(count), false);
  for (int64_t route = 0; route < count; ++route) {
    const int64_t slot = slots[route];
    if (slot < 0 || slot >= count || taken[static_cast<size_t>(slot)])
      throw RuntimeError(where + ": slots[" + std::to_string(route) + "] = " + std::to_string(slot) +
                         (slot < 0 || slot >= count ? " is outside [0, " + std::to_string(count) + ")"
                                                    : " repeats an earlier slot") +
                         ": the slots must be a permutation, as moe_dispatch makes them");
    taken[static_cast<size_t>(slot)] = true;
  }
}

class MoePermuteKernel final : public Kernel {
 public:
  MoePermuteKernel(std::string where, MoePermutationContract contract) : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const auto* input = inputs[0].as<const uint8_t>();
    const int64_t* slots = inputs[1].as<const int64_t>();
    auto* result = outputs[0].as<uint8_t>();
    checkPermutation(where_, slots, c_.tokens * c_.topK);
    const size_t rowBytes = static_cast<size_t>(c_.rowElements) * dtypeSize(c_.dtype);
    cpu::parallelFor(context, c_.tokens, cpu::rowGrain(c_.topK * c_.rowElements), [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token)
        for (int64_t j = 0; j < c_.topK; ++j)
          std::memcpy(result + slots[token * c_.topK + j] * rowBytes, input + token * rowBytes, rowBytes);
    });
  }

 private:
  std::string where_;
  MoePermutationContract c_;
};

std::unique_ptr<Kernel> createMoePermuteKernel(const KernelSignature& signature) {
  return std::make_unique<MoePermuteKernel>(signature.where, parseMoePermuteContract(signature));
}

// Accumulates in f32 for f32 rows (the widened 16-bit ones too) and in f64 for f64 rows, starting
// from zero and adding the routes in order of j, as moe_experts sums its routes.
template <typename T>
class MoeCombineKernel final : public Kernel {
 public:
  MoeCombineKernel(std::string where, MoePermutationContract contract) : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* rows = inputs[0].as<const T>();
    const int64_t* slots = inputs[1].as<const int64_t>();
    const T* weights = c_.weighted ? inputs[2].as<const T>() : nullptr;
    T* result = outputs[0].as<T>();
    checkPermutation(where_, slots, c_.tokens * c_.topK);
    const int64_t width = c_.rowElements;
    cpu::parallelFor(context, c_.tokens, cpu::rowGrain(c_.topK * width), [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        T* out = result + token * width;
        std::fill_n(out, width, T(0));
        for (int64_t j = 0; j < c_.topK; ++j) {
          const int64_t route = token * c_.topK + j;
          const T* row = rows + slots[route] * width;
          if (weights) {
            const T weight = weights[route];
            for (int64_t e = 0; e < width; ++e) out[e] += weight * row[e];
          } else {
            for (int64_t e = 0; e < width; ++e) out[e] += row[e];
          }
        }
      }
    });
  }

 private:
  std::string where_;
  MoePermutationContract c_;
};

std::unique_ptr<Kernel> createMoeCombineKernel(const KernelSignature& signature) {
  const MoePermutationContract c = parseMoeCombineContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<MoeCombineKernel<double>>(signature.where, c);
  return std::make_unique<MoeCombineKernel<float>>(signature.where, c);
}

// ---------------------------------------------------------------------------------------------
// moe_local_experts and its backward: the received rows are grouped by source peer, then by local
// expert; each expert's rows from every source are gathered into one block ("slots" in expert
// order), run through that expert's GEMMs, and scattered back to their rows.

// Where each counted row goes in the expert-ordered blocks: moe/ExpertsMath.h's localBlocks, which
// the CUDA kernels use too (negative counts, or more counted rows than the capacity, are a run-time
// error raised before any output is written).
using ExpertBlocks = moe_experts::LocalBlocks;

ExpertBlocks blocksOf(const std::string& where, const int64_t* counts, const MoeLocalExpertsContract& c) {
  return moe_experts::localBlocks(where, counts, c.peers, c.experts, c.rows);
}

// Calls body(expert, firstSlot, rows) for each expert with at least one row, in expert order.
template <typename Body>
void forEachUsedExpert(const ExpertBlocks& blocks, int64_t experts, Body&& body) {
  for (int64_t expert = 0; expert < experts; ++expert) {
    const int64_t first = blocks.firstSlot[expert], rows = blocks.firstSlot[expert + 1] - first;
    if (rows > 0) body(expert, first, static_cast<int>(rows));
  }
}

template <typename T>
std::unique_ptr<T[]> uninitialised(int64_t count) {
  return std::make_unique_for_overwrite<T[]>(static_cast<size_t>(count));
}

template <typename T>
class MoeLocalExpertsKernel final : public Kernel {
 public:
  MoeLocalExpertsKernel(std::string where, MoeLocalExpertsContract contract) : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* rows = inputs[0].as<const T>();
    const int64_t* counts = inputs[1].as<const int64_t>();
    const T* gateUp = inputs[2].as<const T>();
    const T* down = inputs[3].as<const T>();
    T* result = outputs[0].as<T>();
    const ExpertBlocks blocks = blocksOf(where_, counts, c_);
    const int64_t hidden = c_.hidden, inner = c_.expertHidden, width = 2 * inner, counted = blocks.slots();
    // The capacity's uncounted rows, and every row when an expert's output is an empty sum.
    std::fill_n(result, c_.rows * hidden, T(0));
    if (counted == 0 || hidden == 0 || inner == 0) return;

    const auto input = uninitialised<T>(counted * hidden), gateUpOutput = uninitialised<T>(counted * width);
    const auto output = uninitialised<T>(counted * hidden);
    cpu::parallelFor(context, counted, cpu::rowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot)
        std::copy_n(rows + blocks.rowOfSlot[slot] * hidden, hidden, input.get() + slot * hidden);
    });
    forEachUsedExpert(blocks, c_.experts, [&](int64_t e, int64_t first, int n) {
      gemm(false, true, n, int(width), int(hidden), input.get() + first * hidden, int(hidden), gateUp + e * width * hidden,
           int(hidden), gateUpOutput.get() + first * width, int(width));
    });
    // gelu_tanh(gate) ⊙ up overwrites the gate half of each row; the down GEMM reads it with
    // leading dimension 2I.
    cpu::parallelFor(context, counted, cpu::rowGrain(inner), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot) {
        T* row = gateUpOutput.get() + slot * width;
        for (int64_t i = 0; i < inner; ++i) row[i] = cpu::geluTanh(row[i]) * row[inner + i];
      }
    });
    forEachUsedExpert(blocks, c_.experts, [&](int64_t e, int64_t first, int n) {
      gemm(false, true, n, int(hidden), int(inner), gateUpOutput.get() + first * width, int(width),
           down + e * hidden * inner, int(inner), output.get() + first * hidden, int(hidden));
    });
    cpu::parallelFor(context, counted, cpu::rowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot)
        std::copy_n(output.get() + slot * hidden, hidden, result + blocks.rowOfSlot[slot] * hidden);
    });
  }

 private:
  std::string where_;
  MoeLocalExpertsContract c_;
};

// Per expert e over its block of R rows, X [R, H], output gradients dY [R, H] and row weights w,
// recomputing GU = X [G_e; U_e]ᵀ and Hd = gelu(G) ⊙ U (moe_experts_backward's arithmetic):
//   P = dY D_e,  dw = rowsum(Hd ⊙ P),  dD_e = dYᵀ (w ⊙ Hd),  dG = w P ⊙ U ⊙ gelu'(G),
//   dU = w P ⊙ gelu(G),  d[G_e; U_e] = [dG dU]ᵀ X,  dX = [dG dU] [G_e; U_e].
template <typename T>
class MoeLocalExpertsBackwardKernel final : public Kernel {
 public:
  MoeLocalExpertsBackwardKernel(std::string where, MoeLocalExpertsContract contract)
      : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* rows = inputs[0].as<const T>();
    const T* weights = inputs[1].as<const T>();
    const T* gradOutput = inputs[2].as<const T>();
    const int64_t* counts = inputs[3].as<const int64_t>();
    const T* gateUp = inputs[4].as<const T>();
    const T* down = inputs[5].as<const T>();
    T* gradRows = outputs[0].as<T>();
    T* gradWeights = outputs[1].as<T>();
    // Null for a frozen base's gradients, which the step does not list.
    T* gradGateUp = c_.gradGateUpOutput < 0 ? nullptr : outputs[c_.gradGateUpOutput].as<T>();
    T* gradDown = c_.gradDownOutput < 0 ? nullptr : outputs[c_.gradDownOutput].as<T>();
    const ExpertBlocks blocks = blocksOf(where_, counts, c_);
    const int64_t hidden = c_.hidden, inner = c_.expertHidden, width = 2 * inner, counted = blocks.slots();
    std::fill_n(gradRows, c_.rows * hidden, T(0));
    std::fill_n(gradWeights, c_.rows, T(0));
    if (gradGateUp != nullptr) std::fill_n(gradGateUp, c_.experts * width * hidden, T(0));
    if (gradDown != nullptr) std::fill_n(gradDown, c_.experts * hidden * inner, T(0));
    if (counted == 0 || hidden == 0 || inner == 0) return;

    const auto input = uninitialised<T>(counted * hidden), dOutput = uninitialised<T>(counted * hidden);
    const auto dInput = uninitialised<T>(counted * hidden);
    const auto gateUpOutput = uninitialised<T>(counted * width), dGateUpOutput = uninitialised<T>(counted * width);
    const auto hiddenState = uninitialised<T>(counted * inner), weightedHidden = uninitialised<T>(counted * inner);
    const auto dOutputDown = uninitialised<T>(counted * inner);
    cpu::parallelFor(context, counted, cpu::rowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot) {
        const int64_t row = blocks.rowOfSlot[slot];
        std::copy_n(rows + row * hidden, hidden, input.get() + slot * hidden);
        std::copy_n(gradOutput + row * hidden, hidden, dOutput.get() + slot * hidden);
      }
    });
    forEachUsedExpert(blocks, c_.experts, [&](int64_t e, int64_t first, int n) {
      gemm(false, true, n, int(width), int(hidden), input.get() + first * hidden, int(hidden), gateUp + e * width * hidden,
           int(hidden), gateUpOutput.get() + first * width, int(width));
    });
    cpu::parallelFor(context, counted, cpu::rowGrain(inner), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot) {
        const T* gate = gateUpOutput.get() + slot * width;
        const T weight = weights[blocks.rowOfSlot[slot]];
        for (int64_t i = 0; i < inner; ++i) {
          const T state = cpu::geluTanh(gate[i]) * gate[inner + i];
          hiddenState[slot * inner + i] = state;
          weightedHidden[slot * inner + i] = weight * state;
        }
      }
    });
    forEachUsedExpert(blocks, c_.experts, [&](int64_t e, int64_t first, int n) {
      if (gradDown != nullptr)
        gemm(true, false, int(hidden), int(inner), n, dOutput.get() + first * hidden, int(hidden),
             weightedHidden.get() + first * inner, int(inner), gradDown + e * hidden * inner, int(inner));
      gemm(false, false, n, int(inner), int(hidden), dOutput.get() + first * hidden, int(hidden), down + e * hidden * inner,
           int(inner), dOutputDown.get() + first * inner, int(inner));
    });
    cpu::parallelFor(context, counted, cpu::rowGrain(hidden + inner), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot) {
        const int64_t row = blocks.rowOfSlot[slot];
        const T* p = dOutputDown.get() + slot * inner;
        gradWeights[row] = cpu::dotProduct(hiddenState.get() + slot * inner, p, inner);
        const T* gate = gateUpOutput.get() + slot * width;
        T* dGate = dGateUpOutput.get() + slot * width;
        const T weight = weights[row];
        for (int64_t i = 0; i < inner; ++i) {
          const T dState = weight * p[i];
          dGate[i] = dState * gate[inner + i] * geluTanhDerivative(gate[i]);
          dGate[inner + i] = dState * cpu::geluTanh(gate[i]);
        }
      }
    });
    forEachUsedExpert(blocks, c_.experts, [&](int64_t e, int64_t first, int n) {
      if (gradGateUp != nullptr)
        gemm(true, false, int(width), int(hidden), n, dGateUpOutput.get() + first * width, int(width),
             input.get() + first * hidden, int(hidden), gradGateUp + e * width * hidden, int(hidden));
      gemm(false, false, n, int(hidden), int(width), dGateUpOutput.get() + first * width, int(width),
           gateUp + e * width * hidden, int(hidden), dInput.get() + first * hidden, int(hidden));
    });
    cpu::parallelFor(context, counted, cpu::rowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot)
        std::copy_n(dInput.get() + slot * hidden, hidden, gradRows + blocks.rowOfSlot[slot] * hidden);
    });
  }

 private:
  std::string where_;
  MoeLocalExpertsContract c_;
};

// The GEMMs take int dimensions; an expert's block has at most C rows.
void expectBlasRange(const KernelSignature& signature, const MoeLocalExpertsContract& c) {
  if (c.rows > INT_MAX || 2 * c.expertHidden > INT_MAX || c.hidden > INT_MAX)
    failSignature(signature, "matrix dimensions exceed the BLAS integer range");
}

std::unique_ptr<Kernel> createMoeLocalExpertsKernel(const KernelSignature& signature) {
  const MoeLocalExpertsContract c = parseMoeLocalExpertsContract(signature, {DType::F32, DType::F64});
  expectBlasRange(signature, c);
  if (c.dtype == DType::F64) return std::make_unique<MoeLocalExpertsKernel<double>>(signature.where, c);
  return std::make_unique<MoeLocalExpertsKernel<float>>(signature.where, c);
}

std::unique_ptr<Kernel> createMoeLocalExpertsBackwardKernel(const KernelSignature& signature) {
  const MoeLocalExpertsContract c = parseMoeLocalExpertsBackwardContract(signature, {DType::F32, DType::F64});
  expectBlasRange(signature, c);
  if (c.dtype == DType::F64) return std::make_unique<MoeLocalExpertsBackwardKernel<double>>(signature.where, c);
  return std::make_unique<MoeLocalExpertsBackwardKernel<float>>(signature.where, c);
}

}  // namespace

void registerMoeDispatchCpuKernels(KernelRegistry& registry) {
  // The routing table and the permutation move ids and bits; 16-bit rows are permuted as they are.
  const KernelTraits movesBits{.movesBitsOnly = true};
  registry.add("moe_dispatch", createMoeDispatchKernel, movesBits);
  registry.add("moe_permute", createMoePermuteKernel, movesBits);
  registry.add("moe_combine", createMoeCombineKernel);
  registry.add("moe_local_experts", createMoeLocalExpertsKernel);
  registry.add("moe_local_experts_backward", createMoeLocalExpertsBackwardKernel);
}

}  // namespace dgemma
