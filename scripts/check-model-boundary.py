#!/usr/bin/env python3
"""The model boundary (docs/architecture.md, "The model boundary"): no C++ file of the runtime or the
tools but a model family's adapter (runtime/model/<family>/) spells one of DiffusionGemma's entry,
field or tensor names. The names are those of the model's spec, models/diffusion_gemma/spec/Interface.h;
the runtime takes them from the adapter's ModelContract.

Not checked: the bucket dimensions (layout words the trainer's own records share), the dgemma-run
subcommand verbs (a line that adds a CLI subcommand), the metrics writer, whose keys are the
metrics file's format (docs/training.md, "Metrics file"), and dgemma-serve's OpenAI API layer
(runtime/serve/api), whose keys are OpenAI's request format ("temperature" is a request field there).

Usage: check-model-boundary.py [--root DIR] [--interface FILE]; exits 1 listing every file:line.
"""
import argparse
import pathlib
import re
import sys

SCANNED = ("runtime", "tools")
SUFFIXES = {".cpp", ".h", ".cu", ".cuh"}
ADAPTERS = re.compile(r"^runtime/model/[^/]+/")
EXEMPT_FILES = re.compile(r"^(runtime/train/MetricsWriter\.(h|cpp)|runtime/serve/api/.*)$")
EXEMPT_LINE = re.compile(r"add_subcommand\(")


def interface_names(path):
    text = path.read_text(encoding="utf-8")
    names = {}
    for constant, value in re.findall(r'constexpr const char\* (k\w+) = "([^"]+)";', text):
        if constant.endswith("Dimension"):
            continue
        names[value] = constant
    if not names:
        sys.exit(f"{path}: no names found (expected `inline constexpr const char* kName = \"name\";` lines)")
    return names


def main():
    parser = argparse.ArgumentParser()
    here = pathlib.Path(__file__).resolve().parent.parent
    parser.add_argument("--root", type=pathlib.Path, default=here)
    parser.add_argument("--interface", type=pathlib.Path, default=here / "models/diffusion_gemma/spec/Interface.h")
    args = parser.parse_args()
    names = interface_names(args.interface)
    literal = re.compile(r'"(' + "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True)) + r')"')
    problems = []
    for top in SCANNED:
        for path in sorted((args.root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            relative = path.relative_to(args.root).as_posix()
            if ADAPTERS.match(relative) or EXEMPT_FILES.match(relative):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if EXEMPT_LINE.search(line):
                    continue
                for match in literal.finditer(line):
                    name = match.group(1)
                    problems.append(f"{relative}:{number}: \"{name}\" is DiffusionGemma's {names[name]}: "
                                    "take it from the model adapter's ModelContract (runtime/model/ModelAdapter.h), or in the compiler "
                                    "from models/diffusion_gemma/spec/Interface.h")
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} model name(s) outside the model adapters")
        return 1
    print(f"model boundary: {len(names)} names, none outside runtime/model/<family>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
