#include "runtime/model/ModelAdapter.h"

#include "runtime/model/builtin/BuiltinAdapter.h"
#include "runtime/model/diffusion_gemma/DiffusionGemmaAdapter.h"

namespace dgemma {

const ModelAdapter& modelAdapterFor(ModelFamily family) {
  switch (family) {
    case ModelFamily::Builtin: return builtinAdapter();
    case ModelFamily::DiffusionGemma: return diffusionGemmaAdapter();
  }
  return builtinAdapter();
}

}  // namespace dgemma
