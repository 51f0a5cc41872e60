#!/usr/bin/env python3
"""Report import cycles between the modules of a Rust crate.

Why a script and not `cargo modules`: cargo-modules builds rust-analyzer
(minutes of compilation on a shared two-core machine) to answer a question
that the crate's `use` lines answer. This reads each module's source,
resolves every `crate::`, `super::` and `self::` path (in `use` trees and
inline) to the module that holds it, and checks, for every module M, that
M's direct children form a directed acyclic graph: child A depends on
child B when any file under A names anything under B. A child naming its
own ancestor (`super::Item`) is the ordinary parent/child arrangement and is
not an edge between siblings; two siblings needing each other is the cycle
a reader trips over.

Test-only code (`#[cfg(test)]` items and files) counts like any other: a
test that needs a sibling's internals is still a dependency.

Usage: resources/module_cycles.py CRATE_SRC_DIR... ; exit status 1 when a
cycle is found. `--edges` prints every sibling edge as well.
"""

import os
import re
import sys
from collections import defaultdict


def strip_comments_and_strings(text):
    """Drop comments, string and char literals so paths in them don't count."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'r(#*)".*?"\1', '""', text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text, flags=re.S)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    return text


def module_files(src):
    """Map module path (tuple) -> file for one crate's src directory."""
    mods = {}
    for root in ("lib.rs", "main.rs"):
        if os.path.exists(os.path.join(src, root)):
            mods[()] = os.path.join(src, root)
            break

    def walk(path, file):
        text = strip_comments_and_strings(open(file).read())
        for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            if file.endswith(("lib.rs", "main.rs", "mod.rs")):
                base = os.path.dirname(file)
            else:
                base = file[:-3]
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    mods[path + (name,)] = cand
                    walk(path + (name,), cand)
                    break

    walk((), mods[()])
    return mods


def use_paths(tree):
    """Expand one `use` tree (`a::{b, c::{d, e}}`) into its leaf paths."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)  # `x as y` names x
    tree = tree.replace(" ", "").replace("\n", "")
    out = []

    def expand(prefix, t):
        depth, parts, cur = 0, [], ""
        for ch in t:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        for p in parts:
            if not p:
                continue
            if "{" in p:
                head, rest = p.split("{", 1)
                expand(prefix + [s for s in head.split("::") if s], rest[:-1])
            else:
                out.append(prefix + [s for s in p.split("::") if s])

    expand([], tree)
    return out


def referenced_paths(text):
    """Every path a file names through `crate::`, `super::` or `self::`."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]*);", text):
        paths.extend(use_paths(m.group(1)))
    body = re.sub(r"\buse\s+[^;]*;", " ", text)
    for m in re.finditer(r"\b((?:crate|super|self)(?:\s*::\s*\w+)+)", body):
        paths.append(re.sub(r"\s", "", m.group(1)).split("::"))
    return paths


def resolve(mod, path, mods):
    """The deepest known module a path starting in `mod` lands in."""
    cur = list(mod)
    segs = list(path)
    if not segs:
        return None
    if segs[0] == "crate":
        cur, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not cur:
                    return None
                cur.pop()
            segs = segs[1:]
    else:
        return None  # external crate or a name brought in by another `use`
    for s in segs:
        if tuple(cur + [s]) in mods:
            cur.append(s)
        else:
            break
    return tuple(cur)


def sibling_edges(mods):
    """(parent, a, b) for each child a of parent that names something under b."""
    edges = defaultdict(set)
    for mod, file in mods.items():
        text = strip_comments_and_strings(open(file).read())
        for path in referenced_paths(text):
            target = resolve(mod, path, mods)
            if target is None:
                continue
            # Common ancestor, then the two children of it that differ.
            i = 0
            while i < len(mod) and i < len(target) and mod[i] == target[i]:
                i += 1
            if i < len(mod) and i < len(target):
                edges[mod[:i]].add((mod[i], target[i]))
    return edges


def cycles(nodes_edges):
    """Strongly connected components with more than one node (Tarjan)."""
    graph = defaultdict(set)
    for a, b in nodes_edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv):
    show_edges = "--edges" in argv
    srcs = [a for a in argv if not a.startswith("--")]
    total = 0
    for src in srcs:
        mods = module_files(src)
        edges = sibling_edges(mods)
        found = 0
        for parent in sorted(edges):
            pname = "::".join(("crate",) + parent)
            if show_edges:
                for a, b in sorted(edges[parent]):
                    print(f"{src}: {pname}: {a} -> {b}")
            for comp in cycles(edges[parent]):
                found += 1
                inner = sorted((a, b) for a, b in edges[parent] if a in comp and b in comp)
                detail = ", ".join(f"{a}->{b}" for a, b in inner)
                print(f"{src}: cycle under {pname}: {{{', '.join(comp)}}}  [{detail}]")
        print(f"{src}: {len(mods)} modules, {found} cycle(s)")
        total += found
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
