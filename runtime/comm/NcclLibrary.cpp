#include "runtime/comm/NcclLibrary.h"

#include <dlfcn.h>

#include "support/Error.h"

namespace dgemma {

namespace {

constexpr int kOldestVersion = 21300;  // NCCL 2.13.0 (the first with ncclGetLastError), as ncclGetVersion encodes it

std::string needsNccl(const std::string& soname) {
  return "--backend cuda with several ranks needs NCCL 2.13 or newer (" + soname + ", part of the CUDA toolkit)";
}

template <typename Function>
void resolve(void* handle, const std::string& soname, const char* symbol, Function& function) {
  ::dlerror();
  function = reinterpret_cast<Function>(::dlsym(handle, symbol));
  if (function == nullptr) {
    const char* reason = ::dlerror();
    throw RuntimeError(needsNccl(soname) + ": " + soname + " has no " + symbol + (reason ? std::string(": ") + reason : ""));
  }
}

}  // namespace

NcclLibrary loadNcclLibrary(const std::string& soname) {
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace, nothing else binds to them.
  void* handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = ::dlerror();
    throw RuntimeError(needsNccl(soname) + ", and it cannot be loaded: " + (reason ? reason : "unknown reason"));
  }
  NcclLibrary library;
  try {
    resolve(handle, soname, "ncclGetVersion", library.getVersion);
    resolve(handle, soname, "ncclGetErrorString", library.getErrorString);
    resolve(handle, soname, "ncclGetLastError", library.getLastError);
    resolve(handle, soname, "ncclGetUniqueId", library.getUniqueId);
    resolve(handle, soname, "ncclCommInitRank", library.commInitRank);
    resolve(handle, soname, "ncclCommDestroy", library.commDestroy);
    resolve(handle, soname, "ncclCommAbort", library.commAbort);
    resolve(handle, soname, "ncclCommGetAsyncError", library.commGetAsyncError);
    resolve(handle, soname, "ncclAllReduce", library.allReduce);
    resolve(handle, soname, "ncclAllGather", library.allGather);
    resolve(handle, soname, "ncclReduceScatter", library.reduceScatter);
    resolve(handle, soname, "ncclBroadcast", library.broadcast);
    resolve(handle, soname, "ncclReduce", library.reduce);
    resolve(handle, soname, "ncclSend", library.send);
    resolve(handle, soname, "ncclRecv", library.recv);
    resolve(handle, soname, "ncclGroupStart", library.groupStart);
    resolve(handle, soname, "ncclGroupEnd", library.groupEnd);
    ncclResult_t status = library.getVersion(&library.version);
    if (status != ncclSuccess)
      throw RuntimeError(needsNccl(soname) + ": ncclGetVersion failed: " + library.getErrorString(status));
    if (library.version < kOldestVersion)
      throw RuntimeError(needsNccl(soname) + ", and " + soname + " is version code " + std::to_string(library.version));
  } catch (...) {
    ::dlclose(handle);
    throw;
  }
  return library;
}

const NcclLibrary& ncclLibrary() {
  // A failed load throws out of the initializer, so the next call tries again (and fails alike).
  static const NcclLibrary library = loadNcclLibrary("libnccl.so.2");
  return library;
}

}  // namespace dgemma
