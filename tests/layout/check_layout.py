#!/usr/bin/env python3
"""Checks the project's layering and size rules over #include lines and source files.

Layering (what may include what, by the folder of the including file):
  - runtime/ never includes models/, checkpoint/ or apps/;
  - runtime/core/, comm/ and planner/ include nothing from the rest of runtime/ (runtime/core/ only);
  - runtime/core/ includes only runtime/core/;
  - only apps/ includes apps/ (and the tests of apps/);
  - planner/ never includes models/ (the planner takes inventories; model presets live in
    models/), and planner/CMakeLists.txt links no library that models/CMakeLists.txt defines.
Test switches: product code (every source file outside tests/) reads no test-only switch: no
MFSDP_TEST_* name appears in it (faults are injected from tests/: signals from the drivers,
test-only models and observers, the filesystem).
Sizes, in runtime/engine/ and apps/train/: no source file over 600 lines and no function body
over 80 lines (a function is a definition that starts at column 0 and ends at the first `}` at
column 0 after it).
Prints every violation with file:line and exits 1 when there is one.
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
FOLDERS = ("runtime", "optim", "models", "comm", "planner", "checkpoint", "apps", "tests")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80
SIZE_SCOPE = ("runtime/engine/", "apps/train/")


def sources():
    for top in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith(SOURCES):
                    path = os.path.join(dirpath, f)
                    yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


def layering_errors(rel, lineno, target):
    errors = []
    if rel.startswith("runtime/") and target.startswith(("models/", "checkpoint/", "apps/")):
        errors.append("runtime/ must not include " + target)
    if rel.startswith(("runtime/core/", "comm/", "planner/")) and target.startswith("runtime/") \
            and not target.startswith("runtime/core/"):
        errors.append(rel.split("/")[0] + "/ may include only runtime/core/ from runtime/, not " + target)
    if rel.startswith("runtime/core/") and not target.startswith("runtime/core/"):
        errors.append("runtime/core/ includes only runtime/core/, not " + target)
    if target.startswith("apps/") and not rel.startswith(("apps/", "tests/")):
        errors.append("only apps/ (and its tests) may include apps/, not " + rel)
    if rel.startswith("planner/") and target.startswith("models/"):
        errors.append("planner/ must not include models/ (" + target + ")")
    return ["%s:%d: %s" % (rel, lineno, e) for e in errors]


TEST_SWITCH = re.compile(r"MFSDP_TEST_?[A-Z_]*")
LIBRARY = re.compile(r"add_library\(\s*([A-Za-z0-9_]+)")


def test_switch_errors(rel, lines):
    """Product sources (outside tests/) must not name a test-only switch (MFSDP_TEST_*)."""
    if rel.startswith("tests/"):
        return []
    return ["%s:%d: product code names the test-only switch %s (inject the fault from tests/)" %
            (rel, n, m.group(0)) for n, line in enumerate(lines, 1) for m in [TEST_SWITCH.search(line)] if m]


def cmake_link_errors():
    """planner/CMakeLists.txt must not name a library defined in models/CMakeLists.txt."""
    def read(rel):
        path = os.path.join(ROOT, rel)
        return open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    models = set(LIBRARY.findall(read("models/CMakeLists.txt")))
    errors = []
    for n, line in enumerate(read("planner/CMakeLists.txt").split("\n"), 1):
        code = line.split("#", 1)[0]
        for lib in sorted(models):
            if re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % lib, code):
                errors.append("planner/CMakeLists.txt:%d: planner/ must not link %s (a models/ library)" % (n, lib))
    return errors


NOT_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|template|typedef|using|static_assert|#|//|/\*)")


def function_spans(lines):
    """(first line index, last line index) of every function defined at column 0: a line that
    starts with a name, contains '(' and is not a declaration, up to the first '}' at column 0."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line[:1].isalpha() or line[:1] == "_":
            if "(" in line and not NOT_FUNCTION.match(line) and not line.rstrip().endswith(";"):
                body = i
                while body < len(lines) and not lines[body].rstrip().endswith("{"):
                    if lines[body].rstrip().endswith(";"):
                        body = -1
                        break
                    body += 1
                if body >= 0:
                    end = body
                    while end < len(lines) and not lines[end].startswith("}"):
                        end += 1
                    yield i, end
                    i = end
        i += 1


def size_errors(rel, lines):
    errors = []
    if len(lines) > MAX_FILE_LINES:
        errors.append("%s: %d lines (limit %d)" % (rel, len(lines), MAX_FILE_LINES))
    for first, last in function_spans(lines):
        length = last - first + 1
        if length > MAX_FUNCTION_LINES:
            errors.append("%s:%d: function of %d lines (limit %d): %s" %
                          (rel, first + 1, length, MAX_FUNCTION_LINES, lines[first].strip()[:70]))
    return errors


def main():
    errors, checked = [], 0
    for rel, path in sources():
        checked += 1
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if m:
                errors += layering_errors(rel, n, m.group(1))
        if rel.startswith(SIZE_SCOPE):
            errors += size_errors(rel, lines)
        errors += test_switch_errors(rel, lines)
    errors += cmake_link_errors()
    for e in errors:
        print(e)
    print("check_layout: %d files, %d violation(s)" % (checked, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
