# Every GoogleTest executable is registered through dgemma_discover_tests so that
# one rule holds for all of them.
#
# Discovery runs the freshly linked executable with --gtest_list_tests. An
# executable linked against cuBLAS maps several hundred MiB of shared libraries
# before main(); on a fresh machine with a cold page cache and both cores busy
# compiling, that alone exceeded GoogleTest's default 5 s and failed the build.
# The limit only guards against a hung executable, so it is generous.
set(DGEMMA_TEST_DISCOVERY_TIMEOUT 120)

function(dgemma_discover_tests target)
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT ${DGEMMA_TEST_DISCOVERY_TIMEOUT} ${ARGN})
endfunction()
