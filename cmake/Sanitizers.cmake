# Instrumentation for the two hardening builds (docs/fuzzing.md):
#  - DGEMMA_SANITIZE: every C and C++ object and link gets AddressSanitizer + UndefinedBehaviorSanitizer
#    (scripts/test.sh --sanitize runs the whole suite so). CUDA device code is not instrumented: nvcc
#    rejects the flags, and what runs on the device is not host memory anyway.
#  - DGEMMA_FUZZ (clang only): the same, plus libFuzzer's coverage instrumentation on every library
#    (fuzzer-no-link); the fuzz/ executables add libFuzzer's main.
# UBSan does not recover (-fno-sanitize-recover): a report ends the process with an error, so a test
# or a fuzz run cannot pass over undefined behaviour. Frame pointers and line tables keep the
# reports' stacks readable at -O3.
if(NOT DGEMMA_SANITIZE AND NOT DGEMMA_FUZZ)
  return()
endif()

set(DGEMMA_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1)
if(DGEMMA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DGEMMA_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++-19 "
                        "-DCMAKE_C_COMPILER=clang-19, as scripts/fuzz.sh does")
  endif()
  list(APPEND DGEMMA_SANITIZER_FLAGS -fsanitize=fuzzer-no-link)
  # libstdc++ 12's std::stable_sort calls its own get_temporary_buffer, which it marks deprecated in
  # C++20; clang reports that at every instantiation in our code (GCC does not).
  list(APPEND DGEMMA_SANITIZER_FLAGS -Wno-deprecated-declarations)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${DGEMMA_SANITIZER_FLAGS}>")
add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=address,undefined>")
message(STATUS "dgemma: sanitizers on (${DGEMMA_SANITIZER_FLAGS})")
