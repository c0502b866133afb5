#!/usr/bin/env python3
"""The house's shape, printed and checked (issue 30): `make test` runs this.

  python3 tests/house_check.py [--root DIR] [--build DIR] [--max-lines 80]

Prints one figure per rule and fails (exit 1) when a rule is broken:

1. functions: no hand-written function over --max-lines lines outside tests/,
   bench/ and *_test.cc files (the longest ones are printed either way),
   besides those in KNOWN_LONG (a ratchet: an entry that is fixed must go);
2. layers: no `#include "aggregation/..."` in net/, and no <zmq.hpp> reached
   from coordinator/round_engine.h or client/session.h through the
   project's own headers;
3. worker: worker/ includes nothing from coordinator/, its meson.build does
   not name coordinator_dep, and (with --build) worker_test's link line has
   no libcohort_coordinator.a;
4. stages: each secure-aggregation stage name is written once, as a string
   literal, in the code outside tests/;
5. clock: the real clock (std::chrono clocks' now(), SteadyNowMs(),
   WallSeconds(), time(), gettimeofday, clock_gettime) is read only in
   common/, the transports and collectives (their I/O waits) and the
   daemons' I/O loops (the files in CLOCK_ALLOWED).

Function lengths come from a small C++ scanner that knows comments, string
and raw-string literals, preprocessor lines and constructor initialiser
lists; it counts from the first line of a definition's head to its closing
brace. pmccabe, Debian's tool for this, stops at C++17 nested namespaces.
"""
import argparse
import os
import re
import sys

SOURCE_DIRS = ["common", "proto", "crypto", "datasets", "train", "collective", "net",
               "aggregation", "privacy", "store", "coordinator", "client", "worker", "sim", "python",
               "cli", "provision"]
STAGES = ["commit_seed", "advertise_keys", "share_keys", "check_shares", "confirm_checked",
          "masked_input", "consistency", "unmasking"]
# Where the real clock may be read, besides common/: the transports' and the
# collectives' waits (I/O by nature) and the daemons' I/O loops.
CLOCK_ALLOWED_DIRS = ["common/", "net/", "collective/"]
CLOCK_ALLOWED = {
    "coordinator/daemon.cc",  # the coordinator's poll loop: deadlines as `now`
    "client/daemon.cc",  # the client's poll loop
    "worker/launch.cc",  # `cohort launch`: waits on its child processes
    "sim/mpi_executors.cc",  # MPI sends and the hosting ranks' stop: I/O waits, not virtual time
}
# The functions still over the limit, by file and name: a ratchet. The rule
# fails on any other function over the limit, and on an entry here that is
# no longer over it (delete the entry when you split the function).
KNOWN_LONG: set[str] = set()
CLOCK_RE = re.compile(r"\b(steady_clock|system_clock|high_resolution_clock)::now\b|"
                      r"\bSteadyNowMs\s*\(|\bWallSeconds\s*\(|\bgettimeofday\s*\(|"
                      r"\bclock_gettime\s*\(|(?<![\w.:>])time\s*\(\s*(nullptr|NULL|0)\s*\)")


def source_files(root, exts=(".cc", ".h")):
    for d in SOURCE_DIRS:
        base = os.path.join(root, d)
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(exts) and not f.endswith("_test.cc"):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def strip_code(text):
    """Text with comments, literals and preprocessor lines blanked out (newlines kept).

    Returns (code, literals): literals is a list of (line, string) for every
    ordinary string literal's contents."""
    out, literals = [], []
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            line += 1
            i += 1
            at_line_start = True
            continue
        if at_line_start and c == "#":  # preprocessor line, with continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    line += 1
                    i += 2
                    continue
                i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            line += text.count("\n", i, j)
            i = j
            continue
        m = re.match(r'(?:u8|u|U|L)?R"([^(\s]*)\(', text[i:i + 40])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            line += text.count("\n", i, end)
            i = end
            continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            if c == '"':
                literals.append((line, text[i + 1:j]))
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out), literals


HEAD_KEYWORDS = re.compile(r"^(template\s*<.*>\s*)?(namespace|extern)\b")
TYPE_KEYWORDS = re.compile(r"\b(class|struct|union)\b")


def classify(head):
    """What a `{` at namespace or class scope opens, from the text before it."""
    h = " ".join(head.split())
    if HEAD_KEYWORDS.match(h) or h == "":
        return "namespace" if h.startswith(("namespace", "extern")) else "other"
    if re.search(r"\benum\b", h):
        return "other"
    paren = h.find("(")
    if TYPE_KEYWORDS.search(h if paren < 0 else h[:paren]) and paren < 0:
        return "class"
    if paren < 0:
        return "other"  # a brace initialiser, or an aggregate
    before = h[:paren]
    if "=" in before.replace("operator=", "").replace("operator==", "").replace(
            "operator<=", "").replace("operator>=", "").replace("operator!=", ""):
        return "other"  # a variable with a (lambda or call) initialiser
    return "function"


def functions(code):
    """(start_line, end_line, head) of every function body at namespace/class scope."""
    found = []
    stack = []  # scope kinds: namespace, class, function, other
    head_start, head = None, []
    pending = None  # (start_line, head) of a constructor whose init list has braces
    line = 1
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        in_decl_scope = all(k[0] in ("namespace", "class") for k in stack)
        if c == "{":
            if in_decl_scope:
                text = "".join(head)
                kind = classify(text) if pending is None else "function"
                start = pending[0] if pending is not None else head_start
                stack.append((kind, start if start is not None else line, text))
            else:
                stack.append(("inner", line, ""))
            head, head_start = [], None
            i += 1
            continue
        if c == "}":
            kind, start, text = stack.pop() if stack else ("other", line, "")
            j = i + 1
            while j < n and code[j] in " \t\n":
                j += 1
            nxt = code[j] if j < n else ""
            if kind == "function" and nxt and nxt in ",{" and all(
                    k[0] in ("namespace", "class") for k in stack):
                pending = (start, text)  # a braced member initialiser: the body follows
            elif kind == "function":
                found.append((start, line, " ".join(text.split())))
                pending = None
            head, head_start = [], None
            i += 1
            continue
        if c == ";" and in_decl_scope:
            head, head_start, pending = [], None, None
            i += 1
            continue
        if in_decl_scope:
            if head_start is None and not c.isspace():
                head_start = line
            head.append(c)
        i += 1
    return found


def check_functions(root, max_lines):
    long = []
    for path in source_files(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            code, _ = strip_code(f.read())
        for start, end, head in functions(code):
            length = end - start + 1
            name = re.sub(r"\s*\(.*", "", head).split(" ")[-1] if head else "?"
            long.append((length, f"{path}:{start}", name))
    long.sort(reverse=True)
    over = [x for x in long if x[0] > max_lines]
    key = lambda x: f"{x[1].split(':')[0]} {x[2]}"
    new = [x for x in over if key(x) not in KNOWN_LONG]
    stale = sorted(KNOWN_LONG - {key(x) for x in over})
    print(f"functions: {len(over)} over {max_lines} lines outside tests/ and bench/ "
          f"(longest {long[0][0] if long else 0}; {len(over) - len(new)} of them known, "
          f"in KNOWN_LONG); the ten longest:")
    for length, where, name in long[:10]:
        print(f"  {length:5d}  {where}  {name}")
    for length, where, name in new:
        print(f"  new over {max_lines}: {where} {name} ({length} lines): split it")
    for k in stale:
        print(f"  KNOWN_LONG lists {k}, now within {max_lines} lines (or gone): delete the entry")
    return not new and not stale


def project_includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        text = f.read()
    return re.findall(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', text, re.M)


def reaches(root, start, target):
    """The chain of project headers from `start` to `#include <target>`, or None."""
    seen, todo = set(), [(start, [start])]
    while todo:
        path, chain = todo.pop()
        if path in seen or not os.path.exists(os.path.join(root, path)):
            continue
        seen.add(path)
        for kind, inc in project_includes(root, path):
            if kind == "<" and inc == target:
                return chain + [f"<{target}>"]
            if kind == '"':
                todo.append((inc, chain + [inc]))
    return None


def check_layers(root):
    ok = True
    bad = []
    for path in source_files(root):
        if path.startswith("net/"):
            bad += [f"{path}: {inc}" for kind, inc in project_includes(root, path)
                    if kind == '"' and inc.startswith("aggregation/")]
    print(f"layers: {len(bad)} includes from net/ into aggregation/")
    for b in bad:
        print(f"  {b}")
    ok &= not bad
    for header in ["coordinator/round_engine.h", "client/session.h"]:
        chain = reaches(root, header, "zmq.hpp")
        print(f"layers: {header} reaches <zmq.hpp>: "
              + ("no" if chain is None else "yes, via " + " -> ".join(chain)))
        ok &= chain is None
    return ok


def check_worker(root, build):
    bad = []
    for path in source_files(root):
        if path.startswith("worker/"):
            bad += [f"{path} includes {inc}" for kind, inc in project_includes(root, path)
                    if kind == '"' and inc.startswith("coordinator/")]
    with open(os.path.join(root, "worker/meson.build")) as f:
        if "coordinator_dep" in f.read():
            bad.append("worker/meson.build names coordinator_dep")
    if build and os.path.exists(os.path.join(build, "build.ninja")):
        with open(os.path.join(build, "build.ninja")) as f:
            for stmt in f.read().split("\nbuild "):
                if stmt.startswith("worker/worker_test:") and "libcohort_coordinator.a" in stmt:
                    bad.append("worker_test links coordinator/libcohort_coordinator.a")
    print(f"worker: {'does not link' if not bad else 'links'} the coordinator library")
    for b in bad:
        print(f"  {b}")
    return not bad


def check_stages(root):
    counts = {s: [] for s in STAGES}
    for path in source_files(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            _, literals = strip_code(f.read())
        for line, lit in literals:
            if lit in counts:
                counts[lit].append(f"{path}:{line}")
    worst = max(len(v) for v in counts.values())
    print(f"stages: each of the {len(STAGES)} stage names written at most {worst} time(s)")
    ok = True
    for stage, where in counts.items():
        if len(where) != 1:
            ok = False
            print(f"  {stage}: {len(where)} times: {', '.join(where)}")
    return ok


def check_clock(root):
    reads = {}
    for path in source_files(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            code, _ = strip_code(f.read())
        hits = [code.count("\n", 0, m.start()) + 1 for m in CLOCK_RE.finditer(code)]
        if hits:
            reads[path] = hits
    allowed = lambda p: p in CLOCK_ALLOWED or any(p.startswith(d) for d in CLOCK_ALLOWED_DIRS)
    bad = {p: h for p, h in reads.items() if not allowed(p)}
    print(f"clock: read in {len(reads)} files, {len(bad)} outside common/, the transports "
          f"and the daemons' I/O loops")
    for p, h in sorted(bad.items()):
        print(f"  {p}: lines {', '.join(map(str, h))}")
    return not bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--build", default="")
    ap.add_argument("--max-lines", type=int, default=80)
    args = ap.parse_args()
    results = [check_functions(args.root, args.max_lines), check_layers(args.root),
               check_worker(args.root, args.build), check_stages(args.root),
               check_clock(args.root)]
    failed = sum(not r for r in results)
    print(f"house check: {len(results) - failed} of {len(results)} rules hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
