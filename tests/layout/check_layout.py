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
Sizes, in every product folder (every source folder but tests/): no source file over 600 lines
and no function body over 80 lines, counted from the first line of the declaration to the closing
brace (functions at namespace scope and member functions defined inside a class; lambdas count
toward the function that holds them). Braces are matched after comments, string literals and
preprocessor lines are blanked out, so a one-line function or an #if block does not stretch a
span; a file whose braces do not balance that way is itself reported. ALLOWED_LONG names the few
functions allowed past 80 lines, each with its reason; an entry that no longer matches a long
function is reported too, so the list only shrinks.
Tests that can fail: no CMakeLists.txt under tests/ sets PASS_REGULAR_EXPRESSION, which replaces
ctest's exit-code check (mfsdp_add_output_test checks the exit code and the output together).
Prints every violation with file:line and exits 1 when there is one.
"""
import bisect
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
FOLDERS = ("runtime", "optim", "models", "comm", "planner", "checkpoint", "apps", "tests")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80
SIZE_SCOPE = tuple(top + "/" for top in FOLDERS if top != "tests")
# "file: function" -> why it may pass MAX_FUNCTION_LINES for now.
ALLOWED_LONG = {}


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


def output_only_test_errors():
    """No PASS_REGULAR_EXPRESSION in the tests' CMake files (comments aside)."""
    errors = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tests")):
        if "CMakeLists.txt" not in files:
            continue
        path = os.path.join(dirpath, "CMakeLists.txt")
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        for n, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
            if "PASS_REGULAR_EXPRESSION" in line.split("#", 1)[0]:
                errors.append("%s:%d: PASS_REGULAR_EXPRESSION replaces the exit-code check; use "
                              "mfsdp_add_output_test (exit code and output together)" % (rel, n))
    return errors


_RAW = re.compile(r'R"([^()\\ ]{0,16})\(')


def code_only(text):
    """The text with comments, string and character literals and preprocessor lines blanked
    (newlines kept, so offsets map to the same lines): what is left is braces, parentheses and
    names only."""
    out, i, n = list(text), 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":  # a directive, with its backslash continuations
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            blank(i, j)
            i = j
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and _RAW.match(text, i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = _RAW.match(text, i)
            j = text.find(")" + m.group(1) + '"', m.end())
            j = n if j < 0 else j + len(m.group(1)) + 2
            blank(i, j)
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # not a digit separator
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


_ACCESS = re.compile(r"\s*((public|private|protected)\s*:(?!:)\s*)*")
_OPERATOR = re.compile(r"\boperator\s*(\(\)|[^\s(]+)")


def _strip_template(head):
    """`head` without its leading `template <...>` clauses."""
    while True:
        m = re.match(r"\s*template\s*<", head)
        if not m:
            return head
        depth, k = 1, m.end()
        while k < len(head) and depth:
            depth += {"<": 1, ">": -1}.get(head[k], 0)
            k += 1
        head = head[k:]


def _top_level_eq_before_call(head):
    """True when an `=` stands before the first `(` (a variable's initializer, not a function)."""
    h = _OPERATOR.sub("operator", head)
    first = h.find("(")
    return "=" in h[:first]


def _is_member_init(head):
    """True for the brace of a member initializer `b_{...}` in a constructor's initializer list."""
    tail = head.rstrip()
    if not tail or not (tail[-1].isalnum() or tail[-1] in "_>"):
        return False
    open_ = head.find("(")
    if open_ < 0:
        return False
    depth, k = 0, open_
    while k < len(head):
        depth += {"(": 1, ")": -1}.get(head[k], 0)
        if depth == 0:
            break
        k += 1
    return re.search(r"(?<!:):(?!:)", head[k:]) is not None


def _classify(head):
    """What a `{` opens at namespace or class scope: 'scope', 'fn' or 'other'."""
    h = _strip_template(_ACCESS.sub("", head, count=1))
    if re.match(r"\s*(namespace|extern)\b", h) and "(" not in h:
        return "scope"
    if re.match(r"\s*((static|inline|constexpr|typedef)\s+)*(class|struct|union)\b", h):
        return "scope"
    if re.match(r"\s*enum\b", h) or "(" not in h or _top_level_eq_before_call(h):
        return "other"
    return "fn"


def function_spans(text):
    """(first line, last line), 0-based, of every function body defined at namespace or class
    scope, from the first line of its declaration to its closing brace; braces are matched in
    the text left by code_only. Raises ValueError when braces do not balance (a preprocessor
    branch that opens a brace another branch opens too)."""
    code = code_only(text)
    newlines = [k for k, c in enumerate(code) if c == "\n"]
    line = lambda pos: bisect.bisect_left(newlines, pos)
    stack, spans = [], []
    head, paren, fn_first, depth = 0, 0, None, 0
    for i, c in enumerate(code):
        if fn_first is not None:
            depth += {"{": 1, "}": -1}.get(c, 0)
            if depth == 0:
                spans.append((fn_first, line(i)))
                fn_first, head = None, i + 1
            continue
        if c in "()":
            paren += 1 if c == "(" else -1
        elif c == ";" and paren == 0:
            head = i + 1
        elif c == "{":
            text_ = code[head:i]
            if paren > 0 or _is_member_init(text_):
                stack.append("inline")
            elif any(k != "scope" for k in stack):
                stack.append("other")
                head = i + 1
            elif _classify(text_) == "fn":
                start = head + _ACCESS.match(text_).end()
                fn_first, depth = line(start), 1
            else:
                stack.append(_classify(text_))
                head = i + 1
        elif c == "}":
            if not stack:
                raise ValueError("unbalanced '}' at line %d" % (line(i) + 1))
            if stack.pop() != "inline":
                head = i + 1
    if stack or fn_first is not None:
        raise ValueError("braces do not balance at the end of the file")
    return spans


def function_name(declaration):
    """The qualified name in a function's declaration: `ShardPlan::validate`, `main`."""
    names = re.findall(r"((?:[A-Za-z_]\w*\s*::\s*)*~?[A-Za-z_]\w*|operator\s*\S+?)\s*\(",
                       _strip_template(_ACCESS.sub("", declaration, count=1)))
    return re.sub(r"\s+", "", names[0]) if names else "?"


def size_errors(rel, text, long_seen):
    """File and function size violations of one product source; adds "file: function" of every
    allowed long function to `long_seen`."""
    lines = text.split("\n")
    errors = []
    if len(lines) > MAX_FILE_LINES:
        errors.append("%s: %d lines (limit %d)" % (rel, len(lines), MAX_FILE_LINES))
    try:
        spans = function_spans(text)
    except ValueError as e:
        return errors + ["%s: cannot measure functions: %s" % (rel, e)]
    code = code_only(text).split("\n")
    for first, last in spans:
        length = last - first + 1
        if length <= MAX_FUNCTION_LINES:
            continue
        key = "%s: %s" % (rel, function_name(" ".join(code[first:last + 1])))
        if key in ALLOWED_LONG:
            long_seen.add(key)
        else:
            errors.append("%s:%d: function %s of %d lines (limit %d)" %
                          (rel, first + 1, key.split(": ", 1)[1], length, MAX_FUNCTION_LINES))
    return errors


def main():
    errors, checked, long_seen = [], 0, set()
    for rel, path in sources():
        checked += 1
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.split("\n")
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if m:
                errors += layering_errors(rel, n, m.group(1))
        if rel.startswith(SIZE_SCOPE):
            errors += size_errors(rel, text, long_seen)
        errors += test_switch_errors(rel, lines)
    errors += cmake_link_errors()
    errors += output_only_test_errors()
    errors += ["tests/layout/check_layout.py: ALLOWED_LONG entry '%s' matches no function over %d lines: "
               "drop it" % (k, MAX_FUNCTION_LINES) for k in sorted(set(ALLOWED_LONG) - long_seen)]
    for e in errors:
        print(e)
    print("check_layout: %d files, %d violation(s)" % (checked, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
