#!/usr/bin/env bash
# The import graph between idem's C files, read from the built objects
# (nm: which file defines each global symbol, which file uses it), and a
# check that it has no cycle and that no layer calls up: the folders of
# src/ are layers, bottom first common, outbox, ops, request, workflow,
# with idem.c (the module's entry) on top.  Prints the edges with --edges.
# Run after `make`; scripts/test.sh runs it.
#
#   scripts/check-layers.sh [--edges]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
# objects whose source is still in the tree (a stale build may have more)
objs=$(find src -name '*.o' | while read -r o; do if [ -f "${o%.o}.c" ]; then echo "$o"; fi; done | sort)
[ -n "$objs" ] || { echo "check-layers: no objects under src/: run make first" >&2; exit 2; }
# shellcheck disable=SC2086
exec python3 - "${1:-}" $objs <<'PY'
import collections, subprocess, sys
show = sys.argv[1] == "--edges"
objs = sys.argv[2:]
defined, used = {}, collections.defaultdict(set)
for o in objs:
    for line in subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TDBR":
            defined[f[2]] = o
        elif len(f) == 2 and f[0] == "U":
            used[o].add(f[1])
edges = collections.defaultdict(lambda: collections.defaultdict(list))
for o, syms in used.items():
    for s in syms:
        d = defined.get(s)
        if d is not None and d != o:
            edges[o][d].append(s)
name = lambda o: o[:-2] + ".c"
if show:
    for o in sorted(edges):
        for d in sorted(edges[o]):
            print(f"{name(o)} -> {name(d)}: {', '.join(sorted(edges[o][d]))}")
# Tarjan's strongly connected components: every component larger than one
# file is a cycle.
index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges.get(v, {}):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        comps.append(comp)
sys.setrecursionlimit(10000)
for v in objs:
    if v not in index:
        visit(v)
LAYERS = ["common", "outbox", "ops", "request", "workflow"]
def layer(o):
    parts = o.split("/")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else len(LAYERS)
upcalls = [(o, d) for o in edges for d in edges[o] if layer(d) > layer(o)]
for o, d in sorted(upcalls):
    print(f"check-layers: {name(o)} calls up into {name(d)}: {', '.join(sorted(edges[o][d]))}", file=sys.stderr)
cycles = [c for c in comps if len(c) > 1]
if not cycles and not upcalls:
    print(f"check-layers: {len(objs)} files in {len(LAYERS)} layers, no import cycle, no call up")
    sys.exit(0)
for c in cycles:
    members = set(c)
    print("check-layers: cycle among " + ", ".join(sorted(name(o) for o in c)), file=sys.stderr)
    for o in sorted(c):
        for d in sorted(edges[o]):
            if d in members:
                print(f"  {name(o)} -> {name(d)}: {', '.join(sorted(edges[o][d]))}", file=sys.stderr)
sys.exit(1)
PY
