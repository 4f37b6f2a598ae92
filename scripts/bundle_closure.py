#!/usr/bin/env python3
"""Library closure of a GPU bundle (scripts/gpu_prepare.sh): which shared libraries its ELF files need,
and where each one comes from.

  bundle_closure.py fill  BUNDLE --provided LIST [--refuse REGEX]
  bundle_closure.py check BUNDLE --provided LIST
  bundle_closure.py loaded BUNDLE --provided LIST --traces DIR [--mpi-processes N]

Every ELF file under BUNDLE (executables, libraries, MPI plugins) names its needs in DT_NEEDED. A need
is met when BUNDLE/lib holds a file of that name, or when the name matches a line of LIST: the
libraries the target machine provides itself (glibc, libstdc++, libgcc_s, the driver's libcuda, the
CUDA libraries of its Python `nvidia-*` wheels). Lines of LIST are sonames or shell patterns; `#`
starts a comment.

`fill` copies every unmet need from this machine (`ldconfig -p`) into BUNDLE/lib until nothing is
missing. A plugin (an ELF under BUNDLE/mpi) that needs a library matching --refuse (network stacks
the bundle leaves out) is removed, and so is a copied library that needs one, with every plugin
that needs that library; an executable that needs one is an error. Last, it removes every RPATH
and RUNPATH (Debian's Open MPI points at its install folder): the bundle's files find their
libraries through LD_LIBRARY_PATH (DIR/env.sh) alone.
`check` only reads: it fails when a need is unmet or when an ELF carries an RPATH/RUNPATH that points
outside the bundle (it would load libraries from wherever that path leads on the target).

`loaded` reads the loader's logs of running processes (LD_DEBUG=libs LD_DEBUG_OUTPUT=DIR/trace): every
library a process initialised must come from BUNDLE or be provided, and at least N processes (the
ranks) must have initialised the bundle's libmpi.

Pure standard library (the target has Python but no binutils guarantee). Exit 0 = closed.
"""
import argparse
import fnmatch
import glob
import os
import re
import shutil
import struct
import subprocess
import sys

DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 1, 5, 15, 29
PT_LOAD, PT_DYNAMIC = 1, 2


def dynamic_section(data):
    """(file offset, size) of the PT_DYNAMIC segment and the PT_LOAD list of an ELF image, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dyn = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dyn = (p_offset, p_filesz)
    return dyn, loads


def dynamic_entries(data, dyn):
    entries = []
    for off in range(dyn[0], dyn[0] + dyn[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        entries.append((tag, val))
    return entries


def read_dynamic(path):
    """Returns (needed sonames, [rpath/runpath strings]) of a 64-bit little-endian ELF, or None when
    the file is not one."""
    with open(path, "rb") as f:
        data = f.read()
    section = dynamic_section(data)
    if section is None:
        return None
    dyn, loads = section
    if dyn is None:
        return [], []  # static executable or object without dynamic section
    entries = dynamic_entries(data, dyn)
    strtab_vaddr = next(v for t, v in entries if t == DT_STRTAB)
    strtab = next(off + strtab_vaddr - va for va, off, sz in loads if va <= strtab_vaddr < va + sz)

    def string(offset):
        end = data.index(b"\0", strtab + offset)
        return data[strtab + offset:end].decode()

    needed = [string(v) for t, v in entries if t == DT_NEEDED]
    paths = [string(v) for t, v in entries if t in (DT_RPATH, DT_RUNPATH)]
    return needed, paths


def strip_search_paths(path):
    """Removes DT_RPATH and DT_RUNPATH from an ELF file (the later entries move up, DT_NULL fills the
    end, as chrpath -d does): bundled files find their libraries through LD_LIBRARY_PATH alone.
    Returns True when the file changed."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    section = dynamic_section(data)
    if section is None or section[0] is None:
        return False
    dyn = section[0]
    entries = dynamic_entries(data, dyn)
    kept = [e for e in entries if e[0] not in (DT_RPATH, DT_RUNPATH)]
    if len(kept) == len(entries):
        return False
    for i in range(dyn[1] // 16):
        tag, val = kept[i] if i < len(kept) else (0, 0)
        struct.pack_into("<qQ", data, dyn[0] + 16 * i, tag, val)
    with open(path, "wb") as f:
        f.write(data)
    return True


def elf_files(bundle):
    for root, _, files in os.walk(bundle):
        for name in sorted(files):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                info = read_dynamic(path)
                if info is not None:
                    yield path, info


def load_provided(path):
    with open(path) as f:
        return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


def is_provided(soname, provided):
    return any(fnmatch.fnmatchcase(soname, p) for p in provided)


def system_libraries():
    """soname -> path of the x86-64 libraries this machine's loader cache knows."""
    out = subprocess.run(["ldconfig", "-p"], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "x86-64" in m.group(2):
            found.setdefault(m.group(1), m.group(3))
    return found


def unmet(bundle, provided):
    """[(elf path, soname)] needs that neither BUNDLE/lib nor the provided list meets."""
    have = set(os.listdir(os.path.join(bundle, "lib")))
    return [(path, so) for path, (needed, _) in elf_files(bundle) for so in needed
            if so not in have and not is_provided(so, provided)]


def fill(bundle, provided, refuse):
    libdir = os.path.join(bundle, "lib")
    os.makedirs(libdir, exist_ok=True)
    system = system_libraries()
    refused = re.compile(refuse) if refuse else None
    dropped = set()  # sonames of copied libraries removed because they need a refused one
    while True:
        missing = unmet(bundle, provided)
        if not missing:
            stripped = sum(strip_search_paths(path) for path, _ in elf_files(bundle))
            print(f"bundle_closure: RPATH/RUNPATH removed from {stripped} files")
            return 0
        changed = False
        for path, so in missing:
            if not os.path.exists(path):
                continue  # removed earlier in this round
            top = os.path.relpath(path, bundle).split(os.sep)[0]
            if (refused and refused.search(so)) or so in dropped:
                if top not in ("mpi", "lib"):
                    print(f"bundle_closure: {path} needs {so}, which the bundle leaves out", file=sys.stderr)
                    return 1
                print(f"bundle_closure: dropping {os.path.relpath(path, bundle)} (needs {so})")
                if top == "lib":
                    dropped.add(os.path.basename(path))
                os.remove(path)
                changed = True
            elif so in system:
                if not os.path.exists(os.path.join(libdir, so)):
                    shutil.copy2(os.path.realpath(system[so]), os.path.join(libdir, so))
                    changed = True
            else:
                print(f"bundle_closure: {path} needs {so}, not found on this machine", file=sys.stderr)
                return 1
        if not changed:
            return 1


def check(bundle, provided):
    bad = 0
    elves = list(elf_files(bundle))
    for path, (_, paths) in elves:
        for entry in paths:
            for d in entry.split(":"):
                if d and not d.startswith("$ORIGIN"):
                    print(f"closure: {os.path.relpath(path, bundle)} has RPATH/RUNPATH {d} (outside the bundle)")
                    bad += 1
    missing = unmet(bundle, provided)
    for path, so in missing:
        print(f"closure: {os.path.relpath(path, bundle)} needs {so}: neither in lib/ nor on the provided list")
    bad += len(missing)
    used = sorted({so for _, (needed, _) in elves for so in needed if is_provided(so, provided)})
    print(f"closure: {len(elves)} ELF files, {len(os.listdir(os.path.join(bundle, 'lib')))} bundled libraries, "
          f"provided by the target: {' '.join(used)}")
    print("closure: " + ("closed" if bad == 0 else f"OPEN ({bad} problems)"))
    return 0 if bad == 0 else 1


def loaded(bundle, provided, traces, mpi_processes):
    with_mpi = outside = 0
    for path in sorted(glob.glob(os.path.join(traces, "*"))):
        with open(path, errors="replace") as f:
            libs = re.findall(r"calling init: (\S+)", f.read())
        ours = [p for p in libs if os.path.realpath(p).startswith(bundle + os.sep)]
        bad = [p for p in libs if p not in ours and not is_provided(os.path.basename(p), provided)]
        outside += len(bad)
        with_mpi += any(os.path.basename(p) == "libmpi.so.40" for p in ours)
        print(f"loaded: process {path.rsplit('.', 1)[-1]}: {len(libs)} libraries and plugins, {len(ours)} from the "
              f"bundle, {len(libs) - len(ours) - len(bad)} provided" + "".join(f"\n  outside: {p}" for p in bad))
    print(f"loaded: {with_mpi} processes ran the bundle's libmpi (need {mpi_processes}); "
          f"{outside} libraries from outside")
    return 0 if with_mpi >= mpi_processes and outside == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["fill", "check", "loaded"])
    ap.add_argument("bundle")
    ap.add_argument("--provided", required=True, help="list of sonames the target machine provides")
    ap.add_argument("--refuse", default="", help="regex of sonames never copied (plugins needing them are dropped)")
    ap.add_argument("--traces", help="folder of LD_DEBUG=libs logs (loaded)")
    ap.add_argument("--mpi-processes", type=int, default=1, help="processes that must run the bundle's libmpi")
    a = ap.parse_args()
    if not os.path.isdir(a.bundle):
        print(f"bundle_closure: {a.bundle} is not a directory", file=sys.stderr)
        return 2
    bundle, provided = os.path.realpath(a.bundle), load_provided(a.provided)
    if a.mode == "fill":
        return fill(bundle, provided, a.refuse)
    if a.mode == "loaded":
        return loaded(bundle, provided, a.traces, a.mpi_processes)
    return check(bundle, provided)


if __name__ == "__main__":
    sys.exit(main())
