#!/usr/bin/env python3
"""Keeps the code shown in the markdown pages equal to compiled, tested example files.

A page shows a region of a source file as a fenced code block preceded by a marker comment:

    <!-- snippet: examples/split_kv_decode.cpp decode-plan -->
    ```cpp
    ...the region's lines, dedented...
    ```

The region is the text between two marker lines of the source, `//! [decode-plan]` in C++
(Doxygen's snippet marker) or `# [name]` in Python. A marker may name several regions of the file
(`<!-- snippet: examples/usage_merge.cpp usage-include usage-merge -->`): the block is then those
regions in that order, a blank line between them (e.g. a file's includes and a function's body). Sources must be files that the tests build
and run: `examples/*.cpp` (each one an `Example.*` CTest test) or `python/examples/*.py` (run
by `python/tests/test_doc_examples.py`).

    scripts/doc-snippets.py            # check: exit 1 naming each page and block that drifted
    scripts/doc-snippets.py --write    # rewrite every marked block from its source region

It also refuses Doxygen's `@snippet`, `@dontinclude` and `@include` in the pages: code shown that
way is invisible to a reader of the markdown.
"""

import argparse
import difflib
import glob
import os
import re
import sys
import textwrap

MARKER = re.compile(r"^<!--\s*snippet:\s*(\S+)\s+(\S+(?:\s+\S+)*?)\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
DOXYGEN_INCLUDE = re.compile(r"^\s*[@\\](snippet|dontinclude|include|includelineno)\b")
# Sources whose every file the tests compile and run (see the module docstring).
TESTED_SOURCES = ("examples/", "python/examples/")
REGION_PREFIXES = ("//!", "#")


class SnippetError(Exception):
    pass


def pages(root):
    """The markdown pages that may hold marked blocks: README.md and docs/*.md."""
    found = [os.path.join(root, "README.md")]
    found += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return [p for p in found if os.path.isfile(p)]


def region(root, path, name):
    """The lines of region `name` of `path` (relative to root), dedented, as one string."""
    if not path.startswith(TESTED_SOURCES):
        raise SnippetError(f"source '{path}' is not under {' or '.join(TESTED_SOURCES)} "
                           "(files the tests compile and run)")
    full = os.path.join(root, path)
    if not os.path.isfile(full):
        raise SnippetError(f"source '{path}' does not exist")
    with open(full, encoding="utf-8") as f:
        lines = f.read().split("\n")
    tags = {f"{prefix} [{name}]" for prefix in REGION_PREFIXES}
    at = [i for i, line in enumerate(lines) if line.strip() in tags]
    if len(at) != 2:
        raise SnippetError(f"source '{path}' has {len(at)} marker lines of region '{name}' "
                           f"(expected 2, e.g. '//! [{name}]' or '# [{name}]')")
    body = textwrap.dedent("\n".join(lines[at[0] + 1:at[1]])).strip("\n")
    if not body:
        raise SnippetError(f"region '{name}' of '{path}' is empty")
    return body


def blocks(text):
    """(marker line index, path, region, fence open index, fence close index) of each marked
    block of a page's lines, and the errors of malformed ones."""
    lines = text.split("\n")
    found, errors = [], []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or not FENCE.match(lines[i + 1]):
            errors.append((i, f"marker '{m.group(1)} {m.group(2)}' is not followed by a "
                              "fenced code block on the next line"))
            continue
        fence = FENCE.match(lines[i + 1]).group(1)
        close = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == fence), None)
        if close is None:
            errors.append((i, f"the code block of '{m.group(1)} {m.group(2)}' is not closed"))
            continue
        found.append((i, m.group(1), m.group(2), i + 1, close))
    return lines, found, errors


def process(root, write):
    """Checks (or rewrites) every page; returns the number of problems found (0 when written)."""
    problems = 0
    total = 0
    for page in pages(root):
        rel = os.path.relpath(page, root)
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for n, line in enumerate(text.split("\n"), 1):
            if DOXYGEN_INCLUDE.match(line):
                print(f"{rel}:{n}: '{line.strip()}' shows code only in Doxygen's output: "
                      "inline it as a marked fenced block (scripts/doc-snippets.py)")
                problems += 1
        lines, found, errors = blocks(text)
        for i, message in errors:
            print(f"{rel}:{i + 1}: {message}")
            problems += 1
        changed = False
        # Back to front, so that replacing a block keeps the indices of the earlier ones.
        for marker, path, name, open_, close in reversed(found):
            total += 1
            try:
                want = "\n\n".join(region(root, path, n) for n in name.split())
            except SnippetError as e:
                print(f"{rel}:{marker + 1}: block '{path} {name}': {e}")
                problems += 1
                continue
            have = "\n".join(lines[open_ + 1:close])
            if have == want:
                continue
            if write:
                lines[open_ + 1:close] = want.split("\n")
                changed = True
                print(f"{rel}:{marker + 1}: rewrote block '{path} {name}'")
                continue
            print(f"{rel}:{marker + 1}: block '{path} {name}' differs from its source region "
                  "(scripts/doc-snippets.py --write rewrites it from the source):")
            diff = difflib.unified_diff(have.split("\n"), want.split("\n"),
                                        f"{rel} (page)", f"{path} [{name}] (source)", lineterm="")
            print("\n".join("    " + d for d in diff))
            problems += 1
        if changed:
            with open(page, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
    return problems, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the blocks from the sources")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="the repository root (default: this script's parent folder)")
    ap.add_argument("--min-blocks", type=int, default=1,
                    help="fail when fewer marked blocks are found (a check of nothing passes "
                         "nothing)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    problems, total = process(root, args.write)
    if total < args.min_blocks:
        print(f"found {total} marked blocks in README.md and docs/*.md, expected at least "
              f"{args.min_blocks}")
        problems += 1
    if problems:
        print(f"doc-snippets: {problems} problem(s) in {total} marked blocks")
        return 1
    print(f"doc-snippets: {total} marked blocks {'written' if args.write else 'match their sources'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
