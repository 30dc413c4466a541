# MLIR 19 from Debian's libmlir-19-dev, mlir-19-tools (mlir-tblgen, mlir-pdll), llvm-19-dev
# (MLIRConfig.cmake looks LLVM up) and llvm-19-tools (FileCheck, lit). Pinned: libmlir-22 replaces
# libmlir-19 when installed.
find_package(MLIR REQUIRED CONFIG)
if(NOT LLVM_VERSION_MAJOR EQUAL 19)
  message(FATAL_ERROR "dgemma needs MLIR/LLVM 19 (found ${LLVM_PACKAGE_VERSION} at ${MLIR_DIR}). "
                      "Run scripts/install-deps.sh; never install libmlir-22 beside it.")
endif()
message(STATUS "dgemma: MLIR ${LLVM_PACKAGE_VERSION} from ${MLIR_DIR}")

set(LLVM_RUNTIME_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/bin)
set(LLVM_LIBRARY_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/lib)
set(MLIR_BINARY_DIR ${CMAKE_BINARY_DIR})
list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
include(TableGen)
include(AddLLVM)
include(AddMLIR)
include(HandleLLVMOptions)

include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
# LLVM_DEFINITIONS is one space-separated string; passed as is it yields a mangled -D flag.
separate_arguments(DGEMMA_LLVM_DEFINITIONS NATIVE_COMMAND ${LLVM_DEFINITIONS})
add_definitions(${DGEMMA_LLVM_DEFINITIONS})

if(NOT LLVM_EXTERNAL_LIT)
  set(LLVM_EXTERNAL_LIT "${LLVM_TOOLS_BINARY_DIR}/../build/utils/lit/lit.py")
endif()
if(NOT EXISTS "${LLVM_EXTERNAL_LIT}")
  message(FATAL_ERROR "lit not found at ${LLVM_EXTERNAL_LIT}; pass -DLLVM_EXTERNAL_LIT=.../lit.py")
endif()

include_directories(${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
