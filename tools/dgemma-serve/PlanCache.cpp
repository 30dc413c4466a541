#include "tools/dgemma-serve/PlanCache.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/Driver/Driver.h"
#include "support/Error.h"

namespace dgemma::tool {

namespace fs = std::filesystem;

namespace {

std::string fileBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// What decides the plan: the model directory's config files, every compile option that serving
// sets, and this executable (its size and modification time: a rebuilt compiler compiles again).
std::string planKey(const CompileOptions& options) {
  std::ostringstream text;
  const fs::path model(options.model);
  for (const char* file : {"config.json", "generation_config.json"}) {
    const fs::path path = fs::is_directory(model) ? model / file : model.parent_path() / file;
    text << file << '\n' << (fs::exists(path) ? fileBytes(path) : std::string("(none)")) << '\n';
  }
  text << "micro_batch " << options.microBatch << "\nprompt_len " << options.promptLengths << "\nmax_new_tokens "
       << (options.maxNewTokens ? std::to_string(*options.maxNewTokens) : "config") << "\nimages_per_example "
       << options.imagesPerExample << "\nprecision " << options.precision << "\nbackend " << options.backend
       << "\nlora " << options.lora << ' ' << options.loraTargets << "\nbase_dtype " << options.baseDtype << '\n';
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    text << "executable " << fs::file_size(self, error) << ' ';
    text << fs::last_write_time(self, error).time_since_epoch().count() << '\n';
  }
  const std::string bytes = text.str();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return hex;
}

}  // namespace

std::string defaultPlanCacheDir() {
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache)
    return (fs::path(cache) / "dgemma/plans").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".cache/dgemma/plans").string();
  throw InputError("--plan-cache: required, as neither XDG_CACHE_HOME nor HOME is set");
}

std::string cachedPlan(CompileOptions options, const std::string& cacheDir) {
  const fs::path plan = fs::path(cacheDir) / planKey(options);
  if (fs::exists(plan / "rank-0.dgplan")) return plan.string();
  std::error_code error;
  fs::create_directories(cacheDir, error);
  if (error) throw InputError("--plan-cache " + cacheDir + ": cannot create: " + error.message());
  const fs::path staging =
      fs::path(cacheDir) / (".compiling-" + plan.filename().string() + "-" + std::to_string(::getpid()));
  fs::remove_all(staging, error);
  options.mode = "infer";
  options.output = staging.string();
  try {
    compile(options);
  } catch (...) {
    fs::remove_all(staging, error);
    throw;
  }
  fs::rename(staging, plan, error);
  if (error) {
    // Another server renamed the same plan into place first: keep that one.
    fs::remove_all(staging, error);
    if (!fs::exists(plan / "rank-0.dgplan")) throw RuntimeError("cannot move the plan into " + plan.string());
  }
  return plan.string();
}

}  // namespace dgemma::tool
