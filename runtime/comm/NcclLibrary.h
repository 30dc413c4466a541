// NCCL's entry points, loaded at run time with dlopen rather than linked.
//
// Why dlopen: libnccl.so.2 is a 218 MB library that only a multi-rank `--backend cuda` run uses.
// Linked, every dgemma binary would map and relocate it at startup (the CPU commands, the tests,
// the compiler's tools), and a machine with the CUDA runtime but without NCCL could not start
// dgemma-run at all. Loaded on first use, the binaries keep starting on machines without a GPU
// driver or without NCCL, and such a machine gets one clear error (naming `--backend cuda`) when
// a run actually needs NCCL. The types come from the toolkit's nccl.h, so the pointers have the
// exact signatures of the library's ABI.
//
// Internal to runtime/comm (includes nccl.h, which includes the CUDA runtime headers).
#pragma once

#include <nccl.h>

#include <string>

namespace dgemma {

struct NcclLibrary {
  int version = 0;  // ncclGetVersion: 22809 for 2.28.9
  decltype(&::ncclGetVersion) getVersion = nullptr;
  decltype(&::ncclGetErrorString) getErrorString = nullptr;
  decltype(&::ncclGetLastError) getLastError = nullptr;
  decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&::ncclCommInitRank) commInitRank = nullptr;
  decltype(&::ncclCommDestroy) commDestroy = nullptr;
  decltype(&::ncclCommAbort) commAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&::ncclAllReduce) allReduce = nullptr;
  decltype(&::ncclAllGather) allGather = nullptr;
  decltype(&::ncclReduceScatter) reduceScatter = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) groupStart = nullptr;
  decltype(&::ncclGroupEnd) groupEnd = nullptr;
};

// The library this process uses: libnccl.so.2 through the dynamic loader's search path, loaded
// once (thread-safe) and kept for the life of the process. Throws RuntimeError naming
// `--backend cuda`, the library and the loader's reason when it cannot be loaded, lacks an entry
// point, or is older than NCCL 2.13 (the first with ncclGetLastError).
const NcclLibrary& ncclLibrary();

// Loads `soname` afresh, for tests of the failure messages; the same checks and errors as
// ncclLibrary(). A library that loads stays open for the life of the process.
NcclLibrary loadNcclLibrary(const std::string& soname);

}  // namespace dgemma
