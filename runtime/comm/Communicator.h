// Collectives over a group of ranks (one mesh axis). The executor calls these for collective steps;
// implementations: LocalCommunicator (a group of one), GlooCommunicator (CPU, tests and CPU runs),
// NCCL (GPU, device pointers on the step's stream).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernel_api/Kernel.h"
#include "support/DType.h"

namespace dgemma {

enum class ReduceOp { Sum, Max, Min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;

  // In place: every rank ends with the elementwise reduction of all ranks' `data`.
  virtual void allReduce(ExecContext& context, void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  // recv holds size() * count elements, rank r's contribution at [r * count, (r + 1) * count).
  virtual void allGather(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype) = 0;
  // send holds size() * count elements; rank r receives the reduction of block r.
  virtual void reduceScatter(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype,
                             ReduceOp op) = 0;
  // In place: every rank ends with rank `root`'s `data`.
  virtual void broadcast(ExecContext& context, void* data, int64_t count, DType dtype, int64_t root) = 0;
  // In place, the adjoint of broadcast: rank `root` ends with the elementwise sum of all ranks'
  // `data`, every other rank with zeros.
  virtual void reduceToRoot(ExecContext& context, void* data, int64_t count, DType dtype, int64_t root) = 0;

  // The counts exchange before a ragged all-to-all, on host memory: `sendCounts[p]` is what this
  // rank sends to rank p; the result's entry p is what rank p sends to this rank. size() entries each.
  virtual std::vector<int64_t> exchangeCounts(const std::vector<int64_t>& sendCounts) = 0;
  // Ragged all-to-all. Counts and offsets are in elements, size() entries each: this rank's block
  // for rank p is send[sendOffsets[p], sendOffsets[p] + sendCounts[p]), and rank p's block for this
  // rank lands at recv[recvOffsets[p], recvOffsets[p] + recvCounts[p]). recvCounts must be what
  // exchangeCounts returns for the same sendCounts; a zero count sends or receives nothing. Blocks
  // may sit anywhere in their buffer, but the receive blocks must not overlap.
  virtual void allToAllV(ExecContext& context, const void* send, const std::vector<int64_t>& sendCounts,
                         const std::vector<int64_t>& sendOffsets, void* recv, const std::vector<int64_t>& recvCounts,
                         const std::vector<int64_t>& recvOffsets, DType dtype) = 0;
  virtual void barrier() = 0;
};

// One communicator per mesh axis, keyed by axis name.
class CommunicatorSet {
 public:
  void add(const std::string& axis, std::unique_ptr<Communicator> communicator);
  // Throws InputError when the plan names an axis that has no communicator.
  Communicator& axis(const std::string& name, const std::string& where) const;
  bool has(const std::string& name) const { return byAxis_.count(name) != 0; }

 private:
  std::map<std::string, std::unique_ptr<Communicator>> byAxis_;
};

class Backend;

// A group of one rank: every collective is a copy on the backend's device (or nothing); without a
// backend, on host memory (the world group of a one-rank session).
class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator() = default;
  explicit LocalCommunicator(Backend& backend) : backend_(&backend) {}
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  void allReduce(ExecContext&, void*, int64_t, DType, ReduceOp) override {}
  void allGather(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype) override;
  void reduceScatter(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype,
                     ReduceOp op) override;
  void broadcast(ExecContext&, void*, int64_t, DType, int64_t) override {}
  void reduceToRoot(ExecContext&, void*, int64_t, DType, int64_t) override {}
  std::vector<int64_t> exchangeCounts(const std::vector<int64_t>& sendCounts) override { return sendCounts; }
  void allToAllV(ExecContext& context, const void* send, const std::vector<int64_t>& sendCounts,
                 const std::vector<int64_t>& sendOffsets, void* recv, const std::vector<int64_t>& recvCounts,
                 const std::vector<int64_t>& recvOffsets, DType dtype) override;
  void barrier() override {}

 private:
  void copy(ExecContext& context, void* to, const void* from, uint64_t bytes);

  Backend* backend_ = nullptr;
};

}  // namespace dgemma
