#!/usr/bin/env python3
"""Unit test of check_layout.py's function measurement on small C++ snippets whose spans are known:
one-line functions, #if branches, constructor initializer lists with braces, raw strings, member
functions inside a class, initializer tables of lambdas. Exits 1 on the first wrong span."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_layout import function_name, function_spans  # noqa: E402

CASES = [
    # (source, expected [(first, last)] 0-based lines, expected names)
    ("const char* a(const void* p) { return 0; }\nint b() {\n  return 1;\n}\n",
     [(0, 0), (1, 3)], ["a", "b"]),
    ("int f() {\n#if defined(X)\n  if (x) {\n#else\n  if (y) {\n#endif\n  }\n  return '{';\n}\n",
     None, None),  # both #if branches open a brace: reported as unbalanced
    ("Foo::Foo(int a)\n    : a_(a), b_{a, 2}, c_(std::vector<int>{1}) {\n  x();\n}\n",
     [(0, 3)], ["Foo::Foo"]),
    ("const char* kRe = R\"(}{\"')\";\n// } {\n/* { */\nvoid g() {\n  s = \"}\";\n}\n",
     [(3, 5)], ["g"]),
    ("namespace n {\nclass C final : public B {\n public:\n  void m() const {\n    y();\n  }\n  int v{3};\n};\n}\n",
     [(3, 5)], ["m"]),
    ("const std::map<int, Fn> kTable = {\n  {1, [](int x) { return x; }},\n};\ntemplate <class T>\nT h(T x) {\n  return x;\n}\n",
     [(3, 6)], ["h"]),
    ("bool operator==(const A& a, const A& b) {\n  return a.x == b.x;\n}\nint n = 1'000;\nvoid k() {}\n",
     [(0, 2), (4, 4)], ["operator==", "k"]),
]


def main():
    for n, (src, spans, names) in enumerate(CASES):
        try:
            got = function_spans(src)
        except ValueError:
            got = None
        if got != spans:
            print("case %d: spans %s, expected %s" % (n, got, spans))
            return 1
        lines = src.split("\n")
        got_names = [function_name(" ".join(lines[a:b + 1])) for a, b in (got or [])]
        if names is not None and got_names != names:
            print("case %d: names %s, expected %s" % (n, got_names, names))
            return 1
    print("test_check_layout: %d cases" % len(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
