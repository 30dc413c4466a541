#!/usr/bin/env python3
"""scripts/check-doc-references.py on small source trees written here: a broken reference fails
naming its file, line and the nearest headings; good ones, in every form the checker reads, pass.

    check_doc_references_test.py CHECKER
"""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = None

GUIDE = """# Guide

## Getting started

```
## Not a heading (inside fenced code)
```

### Checkpoints (`--save-dir DIR`)

## The fourth round: less work

**A run-in title.** Not a heading either.
"""


def spelt(text):
    """`text` with DOCS/ spelt docs/: written out, the references below would be the real tree's."""
    return text.replace("DOCS/", "docs/")


def write(root, path, text):
    text = spelt(text)
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as file:
        file.write(text)


def run_checker(root):
    return subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True, check=False)


class CheckDocReferencesTest(unittest.TestCase):
    def tree(self, files):
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        write(directory.name, "docs/guide.md", GUIDE)
        for path, text in files.items():
            write(directory.name, path, text)
        return directory.name

    def test_good_references_pass(self):
        root = self.tree({
            "src/a.h": '// See DOCS/guide.md, "Getting started".\n',
            # Wrapped between the file and the section, and inside the section's text.
            "src/b.cpp": '// The save (DOCS/guide.md,\n// "Getting\n// started").\n',
            # A heading's trailing parenthetical may be left out; several sections in one reference.
            "tools/c.py": '# DOCS/guide.md, "Checkpoints", "Getting started" and "Checkpoints (--save-dir DIR)"\n',
            # Escaped quotes in a string literal.
            "src/d.cpp": 'throw Error("see DOCS/guide.md, \\"Getting started\\"");\n',
            # The file in backticks, as Markdown writes it; a heading's title before its colon.
            "docs/other.md": '# Other\n\nAs `DOCS/guide.md`, "Getting started" says (and "The fourth round").\n',
            "README.md": 'See `DOCS/guide.md`, "The fourth round".\n',
            # A build directory is not part of the source tree.
            "build/CMakeCache.txt": "",
            "build/generated.h": '// DOCS/guide.md, "Gone"\n',
        })
        result = run_checker(root)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("all 8 references name a heading", result.stdout)

    def test_broken_references_fail_naming_the_place(self):
        root = self.tree({
            "src/a.h": '#pragma once\n// See DOCS/guide.md,\n//   "Getting startd".\n',
            "src/b.md": 'DOCS/guide.md, "A run-in title"\n',
            "src/c.py": '# DOCS/guide.md, "Not a heading (inside fenced code)"\n',
            "src/d.sh": '# DOCS/missing.md, "Anything"\n',
        })
        result = run_checker(root)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        lines = result.stdout.splitlines()
        self.assertIn(spelt('src/a.h:2: DOCS/guide.md, "Getting startd": no such heading in docs/guide.md; '
                            'nearest: "Getting started"'), result.stdout)
        self.assertTrue(any(line.startswith(spelt('src/b.md:1: DOCS/guide.md, "A run-in title": no such heading'))
                            for line in lines), result.stdout)
        self.assertTrue(any(line.startswith(spelt('src/c.py:1: DOCS/guide.md, "Not a heading (inside fenced code)"'))
                            for line in lines), result.stdout)
        self.assertIn(spelt('src/d.sh:1: DOCS/missing.md, "Anything": docs/missing.md does not exist'), result.stdout)
        self.assertIn("4 of 4 references name no heading", result.stdout)


if __name__ == "__main__":
    CHECKER = sys.argv.pop(1)
    unittest.main()
