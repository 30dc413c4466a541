#!/usr/bin/env python3
"""Checks that every reference  docs/<name>.md, "<Heading>"  names a heading of that document.

    scripts/check-doc-references.py [ROOT]      ROOT: the source tree (default: this script's)

Code and docs cite a part of a document as  docs/<name>.md, "<Heading>"  (docs/architecture.md,
"Conventions"). The reference may stand in parentheses, may name several headings
(docs/<name>.md, "<A>", "<B>" and "<C>"), may sit inside a string literal with escaped quotes, and
may wrap where a comment breaks its line: the comment leaders of the next line (//, #, *, --) are
skipped.

A reference resolves when its text is a heading of the file (any level, outside fenced code), with
the heading's inline markup (`code`, *emphasis*) dropped; a heading's trailing parenthetical, or what
follows its first ": ", may be left out, so "Checkpoints" names "Checkpoints (`--save-dir DIR`, ...)"
and "The fourth round" names "The fourth round: less work, ...". Nothing else is a target: not a
table row, not a bold run-in title. The file may be written in backticks (`docs/<name>.md`, "...").

The walk covers every source and doc file under ROOT (by extension), skipping hidden directories
and build directories (those holding a CMakeCache.txt), so it works the same in a fresh clone, in
a worktree and in CI. Each broken reference is listed as FILE:LINE with the nearest headings of
its document; the exit status is 1 when there is any, 0 otherwise.
"""

import bisect
import difflib
import os
import re
import sys

SCANNED_SUFFIXES = {
    ".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh", ".td", ".py", ".sh", ".md", ".txt", ".cmake",
    ".mlir", ".toml", ".yml", ".yaml", ".in",
}
SCANNED_NAMES = {"CMakeLists.txt", "run"}
MAX_FILE_BYTES = 4 << 20

# One quoted section: plain quotes, or \"...\" inside a string literal.
_QUOTED = r'(?P<quote{n}>\\?")(?P<section{n}>[^"\\\n]+)(?P=quote{n})'
REFERENCE = re.compile(r"docs/(?P<doc>[A-Za-z0-9_.-]+\.md)`?,\s*" + _QUOTED.format(n=0))
# A further section of the same reference: , "B"  or  and "B"  or  , and "B".
FURTHER_SECTION = re.compile(r"\s*(?:,\s*and|,|and)\s+" + _QUOTED.format(n=1))
COMMENT_LEADER = re.compile(r"^\s*(?://+!?|#+(?=\s|$)|\*(?!\*)|--|;+)?\s*")
HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def source_files(root):
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(
            d for d in subdirectories
            if not d.startswith(".") and not os.path.exists(os.path.join(directory, d, "CMakeCache.txt")))
        for name in sorted(files):
            if name in SCANNED_NAMES or os.path.splitext(name)[1] in SCANNED_SUFFIXES:
                path = os.path.join(directory, name)
                if os.path.getsize(path) <= MAX_FILE_BYTES:
                    yield path


def joined_text(text):
    """The file's lines without their comment leaders, joined by spaces, and each line's offset."""
    pieces, starts, offset = [], [], 0
    for line in text.split("\n"):
        stripped = COMMENT_LEADER.sub("", line, count=1)
        starts.append(offset)
        pieces.append(stripped)
        offset += len(stripped) + 1
    return " ".join(pieces), starts


def plain_heading(text):
    """A heading's text as a reference names it: inline markup dropped, spaces collapsed."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"(\*\*|__|\*|_)(\S(?:.*?\S)?)\1", r"\2", text)
    return " ".join(text.split())


def headings_of(path):
    headings, fenced = [], False
    with open(path, encoding="utf-8") as file:
        for line in file:
            if FENCE.match(line):
                fenced = not fenced
                continue
            match = None if fenced else HEADING.match(line)
            if match:
                headings.append(plain_heading(match.group("text")))
    return headings


def names_for(heading):
    """What a reference may write for a heading: the heading, the heading less a trailing (...), and
    the title before a colon ("The fourth round" for "The fourth round: less work, ...")."""
    names = {heading}
    short = re.sub(r"\s*\([^()]*(?:\([^()]*\)[^()]*)*\)$", "", heading)
    if short:
        names.add(short)
    title = heading.split(": ", 1)[0]
    if title:
        names.add(title)
    return names


def references_in(path):
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except UnicodeDecodeError:
        return
    if "docs/" not in text:
        return
    joined, starts = joined_text(text)
    for match in REFERENCE.finditer(joined):
        line = bisect.bisect_right(starts, match.start())
        sections = [match.group("section0")]
        end = match.end()
        while True:
            further = FURTHER_SECTION.match(joined, end)
            if not further:
                break
            sections.append(further.group("section1"))
            end = further.end()
        for section in sections:
            yield line, match.group("doc"), " ".join(section.split())


def check(root):
    root = os.path.abspath(root)
    docs = os.path.join(root, "docs")
    targets = {}
    problems, count = [], 0
    for path in source_files(root):
        for line, doc, section in references_in(path):
            count += 1
            if doc not in targets:
                doc_path = os.path.join(docs, doc)
                targets[doc] = headings_of(doc_path) if os.path.isfile(doc_path) else None
            headings = targets[doc]
            where = f"{os.path.relpath(path, root)}:{line}"
            reference = f'docs/{doc}, "{section}"'
            if headings is None:
                problems.append(f"{where}: {reference}: docs/{doc} does not exist")
                continue
            if any(section in names_for(heading) for heading in headings):
                continue
            nearest = difflib.get_close_matches(section, headings, n=3, cutoff=0.0)
            problems.append(f"{where}: {reference}: no such heading in docs/{doc}; nearest: " +
                            ", ".join(f'"{heading}"' for heading in nearest))
    return count, problems


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if not os.path.isdir(os.path.join(root, "docs")):
        print(f"check-doc-references: {root}: no docs/ directory (expected the source tree)", file=sys.stderr)
        return 2
    count, problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check-doc-references: {len(problems)} of {count} references name no heading")
        return 1
    print(f"check-doc-references: all {count} references name a heading")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
