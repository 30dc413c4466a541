# lit configuration of dgemma's FileCheck tests (passes, verifiers, tools).
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "dgemma"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.dgemma_obj_root
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py.in", "Inputs"]

llvm_config.use_default_substitutions()
# FileCheck, not and count come from the installed LLVM; dgemma's tools from the build.
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.dgemma_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(["dgemma-opt", "dgemma-compile", "dgemma-run"], [config.dgemma_tools_dir])
config.substitutions.append(("%dgemma_src_root", config.dgemma_src_root))
# Every FileCheck run scopes [[VAR]]s to their CHECK-LABEL block.
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
