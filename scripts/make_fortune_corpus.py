#!/usr/bin/env python3
"""The pre-training demo's corpus (docs/pretraining.md, "The demo"): the fortune cookies of Debian's
`fortunes` package (fortune-mod's data files, Debian main), one JSON line per fortune.

Usage: make_fortune_corpus.py FORTUNES_DIR OUT.jsonl

FORTUNES_DIR is the package's usr/share/games/fortunes. A fortune file holds fortunes separated by
lines of a single "%". Only the categories below are read (the gentler, text-heavy ones; ASCII art
and the category lists of other packages are left out). Overstruck text (character, backspace,
character) keeps its last character, tabs become spaces, trailing spaces go; fortunes shorter than
20 characters are dropped. The order is the files' order, so the corpus is the same on every machine
with the same package version.
"""
import json
import re
import sys

CATEGORIES = ["wisdom", "science", "computers", "work", "education", "food", "kids", "people", "cookie",
              "definitions", "platitudes", "tao", "humorists", "miscellaneous", "linux"]


def fortunes(path):
    with open(path, encoding="utf-8", errors="replace") as stream:
        text = stream.read()
    for block in re.split(r"^%\n", text, flags=re.M):
        block = re.sub(r".\x08", "", block).replace("\t", " ")
        block = "\n".join(line.rstrip() for line in block.strip("\n").split("\n")).strip()
        if len(block) >= 20:
            yield block


def main():
    source, out = sys.argv[1], sys.argv[2]
    count = 0
    with open(out, "w", encoding="utf-8") as stream:
        for category in CATEGORIES:
            for text in fortunes(f"{source}/{category}"):
                stream.write(json.dumps({"text": text, "category": category}) + "\n")
                count += 1
    print(f"{count} fortunes from {len(CATEGORIES)} categories")


if __name__ == "__main__":
    main()
