#!/usr/bin/env python3
"""File-level import cycles under a source folder (default src/backend): an edge A -> B when
file A names a path into file B (`use`, or an inline `crate::`/`super::`/`self::` path), test
modules left out. `mod x;` declarations are not edges. Prints each cycle; exits 1 if any."""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "src/backend"
crate_root = "src"

def module_of(path):
    rel = os.path.relpath(path, crate_root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)

files = {}
for d, _, names in os.walk(crate_root):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.join(d, n)
            files[module_of(p)] = p

def strip_tests(text):
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]

def expand(use):
    """`a::{b, c::{d}}` -> [a::b, a::c::d]"""
    use = use.replace(" ", "").replace("\n", "")
    m = re.match(r"^(.*?)\{(.*)\}$", use)
    if not m:
        return [use]
    head, body = m.groups()
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur); cur = ""; continue
        depth += ch == "{"; depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [x for p in parts if p for x in expand(head + p)]

def resolve(mod, path):
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = mod
        # a file that is a mod.rs is the module itself
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    target = base
    best = files.get(base) and base
    for s in segs:
        target = target + (s,)
        if target in files:
            best = target
    return best

edges = {}
for mod, path in files.items():
    if not path.startswith(root):
        continue
    text = strip_tests(open(path).read())
    text = re.sub(r"//[^\n]*", "", text)
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths += expand(m.group(1))
    paths += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text)
    for p in paths:
        p = re.sub(r"\bas\s+\w+$", "", p).rstrip(":*")
        t = resolve(mod, p)
        if t and t != mod and files[t].startswith(root):
            edges.setdefault(mod, set()).add(t)

# Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1:
            sccs.append(comp)
sys.setrecursionlimit(10000)
for v in list(edges):
    if v not in index:
        visit(v)
for c in sccs:
    print("cycle:", " <-> ".join(files[m] for m in sorted(c)))
print(f"{len(sccs)} file cycles under {root}")
sys.exit(1 if sccs else 0)
