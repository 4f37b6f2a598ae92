#!/usr/bin/env python3
"""Runs a command and checks its exit code and its output together (ctest's
PASS_REGULAR_EXPRESSION alone would pass a command that prints the line and then fails).

usage: expect_output.py EXIT_CODE REGEX -- COMMAND [ARGS...]
REGEX is a Python regular expression searched in stdout and stderr together ('.' matches
newlines). Echoes the output; exit 0 when both hold, 1 otherwise."""
import re
import subprocess
import sys


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit(__doc__)
    want_rc, pattern, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[4:]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    sys.stdout.write(r.stdout)
    ok = True
    if r.returncode != want_rc:
        print(f"expect_output: exit code {r.returncode}, expected {want_rc}")
        ok = False
    if not re.search(pattern, r.stdout, re.S):
        print(f"expect_output: the output does not match {pattern!r}")
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
