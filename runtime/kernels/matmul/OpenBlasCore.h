// OpenBLAS chooses its kernels (its "core") from the CPU model once, when the library loads. A
// model it does not know gets the Prescott core, SSE3 kernels: Debian's OpenBLAS 0.3.21 takes an
// Emerald Rapids Xeon (family 6, model 207) for one and runs f32 GEMMs 4-5 times slower than its
// AVX-512 kernels do on the same CPU. OPENBLAS_CORETYPE, read at load, overrides the choice, so
// the fix has to come before the process starts: re-executing it.
#pragma once

namespace dgemma {

// The core OpenBLAS should use on this CPU when it fell back to Prescott: "SkylakeX" with
// AVX-512 F/BW/DQ/VL, "Haswell" with AVX2 and FMA; nullptr when OpenBLAS chose another core,
// OPENBLAS_CORETYPE is set (the user's choice, or this process was already re-executed), or
// the CPU has neither.
const char* betterOpenBlasCore();

// When betterOpenBlasCore() names one: sets OPENBLAS_CORETYPE to it and re-executes
// /proc/self/exe with `argv` (the process image is replaced; nothing before this call may have
// side effects outside the process). Returns when there is nothing to do, or when the exec
// fails (a note on stderr; the run goes on with the slow core).
void reexecWithBetterOpenBlasCore(char** argv);

}  // namespace dgemma
