#!/usr/bin/env python3
"""The code's shape, checked by .ci/run (ARCHITECTURE.md, "Cross-cutting"):

- every Rust crate of the workspace (`src/` of election, gateway, store,
  serve, client-sdk, names, plumbing, local-cluster, bench, lazyfs and of the
  `palisade` binary): no source file over 500 lines (test files —
  `tests.rs`, `tests/` — may be longer) and no function over 80 lines,
  tests included (a `fn` from its line to its closing brace); the files in
  SIZE_EXEMPT, and only they, are left out of both, each for the reason
  given there. Integration tests beside `src/` (`tests/`, `gateway/tests`,
  `serve/tests`, `lazyfs/tests`) and the Rust SDK's examples
  (`client-sdk/examples`) are not read;
- no import circle between the files of any of those crates: a path (`use`,
  or inline `crate::`/`super::`/`self::`) is an edge to the file that
  defines the module it names, and a `mod.rs`/`lib.rs` re-export (`pub use
  child::X`) is an edge too, so a module root must not define what its
  children use;
- the Go and Python SDKs (`client-sdk/go`, its examples included, and
  `client-sdk/python/src`; test files — `*_test.go`, `tests/` — left out):
  no file over 500 lines and no function over 80 lines (a Go `func` from
  its line to the closing `}` in column 0, as gofmt writes it; a Python
  `def`, nested ones included, from its line to its last, by `ast`);
- no import circle between the Python package's modules: every relative or
  `palisade.`-qualified import, wherever it sits (inside a function, under
  `TYPE_CHECKING`), is an edge to the module it names (`from . import x` to
  module `x` when there is one, else to `__init__`). Go needs no such check:
  the compiler refuses an import cycle between packages, and the SDK is one
  package.

Prints each problem and exits 1 if there is any.
"""
import ast
import os
import re
import sys

LIBRARIES = ["election/src", "gateway/src", "store/src", "serve/src", "client-sdk/src"]
CRATES = LIBRARIES + ["names/src", "plumbing/src", "src", "local-cluster/src", "bench/src", "lazyfs/src"]
# Temporary: files not yet held to the sizes, each with its reason. Remove
# an entry in the change that brings its file within them.
SIZE_EXEMPT = {
    # None today. A file named here (path -> why) is left out of the size
    # checks; say why, and when it will be split.
}
MAX_FILE_LINES = 500
MAX_FN_LINES = 80
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")


def is_test_file(path):
    return os.path.basename(path) == "tests.rs" or "/tests/" in path


def code(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def sizes(root):
    problems = []
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(directory, name)
            if not name.endswith(".rs") or path in SIZE_EXEMPT:
                continue
            lines = open(path, encoding="utf-8").read().split("\n")
            if len(lines) > MAX_FILE_LINES and not is_test_file(path):
                problems.append(f"{path}: {len(lines)} lines (at most {MAX_FILE_LINES})")
            for start, line in enumerate(lines):
                found = FN.match(line)
                if not found:
                    continue
                end = start
                while end < len(lines) and not code(lines[end]).rstrip().endswith(("{", ";")):
                    end += 1
                if end >= len(lines) or not code(lines[end]).rstrip().endswith("{"):
                    continue
                depth = 1
                while depth > 0 and end + 1 < len(lines):
                    end += 1
                    text = code(lines[end])
                    depth += text.count("{") - text.count("}")
                length = end - start + 1
                if length > MAX_FN_LINES:
                    problems.append(
                        f"{path}:{start + 1}: fn {found.group(6)} is {length} lines (at most {MAX_FN_LINES})"
                    )
    return problems


def strip(src):
    src = re.sub(r'pub\(in [^)]*\)', 'pub', src)
    src = re.sub(r'//[^\n]*', '', src)
    src = re.sub(r'/\*.*?\*/', '', src, flags=re.S)
    src = re.sub(r'"(\\.|[^"\\])*"', '""', src)
    return src

def expand(tree):
    """Expands a use tree 'a::{b, c::{d}}' into paths."""
    tree = tree.strip()
    i = tree.find('{')
    if i < 0:
        return [tree.split(' as ')[0].strip()]
    prefix = tree[:i]
    inner = tree[i+1:tree.rfind('}')]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            for e in expand(p):
                out.append(prefix + e if e != 'self' else prefix.rstrip(':'))
    return out

def crate_files(src_root):
    mods = {}
    for dp, _, fs in os.walk(src_root):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, src_root)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
            mods[tuple(rel)] = p
    return mods

def resolve(mods, path):
    best = None
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return best

def circles(src_root):
    mods = crate_files(src_root)
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        src = strip(open(p).read())
        is_mod_file = p.endswith(('mod.rs', 'lib.rs', 'main.rs'))
        here = list(m) if is_mod_file else list(m)
        parent = list(m)[:-1]
        paths = []
        for u in re.finditer(r'\buse\s+([^;]+);', src, flags=re.S):
            paths += expand(re.sub(r'\s+', ' ', u.group(1)))
        for q in re.finditer(r'\b((?:crate|super|self)(?:::\w+)+)', src):
            paths.append(q.group(1))
        for path in paths:
            if path.replace(' ', '') == 'super::*':
                continue  # an inline test module's glob of its own file
            segs = [s for s in path.replace(' ', '').split('::') if s]
            if not segs: continue
            if segs[0] == 'crate': base, rest = [], segs[1:]
            elif segs[0] == 'super':
                base = parent if not is_mod_file else list(m)[:-1]
                rest = segs[1:]
                while rest and rest[0] == 'super': base, rest = base[:-1], rest[1:]
            elif segs[0] == 'self': base, rest = here, segs[1:]
            elif tuple(list(m) + [segs[0]]) in mods: base, rest = list(m), segs
            else: continue
            target = resolve(mods, base + rest)
            if target is not None and target != m:
                # a parent module's file declaring its children is not an import
                edges[m].add(target)
    # circles: SCCs of size > 1
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index: strong(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(comp)
    for v in list(edges):
        if v not in index: strong(v)
    problems = []
    for comp in sccs:
        names = sorted(mods[c] for c in comp)
        problems.append(f"import circle in {src_root}: " + ", ".join(names))
    return problems



GO_SDK = "client-sdk/go"
PYTHON_SDK = "client-sdk/python/src"
PYTHON_PACKAGE = "client-sdk/python/src/palisade"


def sdk_files(root, suffix):
    """The SDK sources under root, test files left out."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "tests")
        for name in sorted(files):
            if name.endswith(suffix) and not name.endswith("_test.go"):
                found.append(os.path.join(directory, name))
    return found


def go_functions(lines):
    """(name, first line, length) of each top-level Go func."""
    for start, line in enumerate(lines):
        found = re.match(r"func (\([^)]*\) )?(\w+)", line)
        if not found:
            continue
        end = start
        if not line.rstrip().endswith("}"):
            while end + 1 < len(lines) and lines[end] != "}":
                end += 1
        yield found.group(2), start, end - start + 1


def python_functions(source):
    """(name, first line, length) of each Python def, nested ones too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno - 1, node.end_lineno - node.lineno + 1


def sdk_sizes():
    problems = []
    for path in sdk_files(GO_SDK, ".go") + sdk_files(PYTHON_SDK, ".py"):
        source = open(path, encoding="utf-8").read()
        lines = source.splitlines()
        if len(lines) > MAX_FILE_LINES:
            problems.append(f"{path}: {len(lines)} lines (at most {MAX_FILE_LINES})")
        functions = go_functions(lines) if path.endswith(".go") else python_functions(source)
        for name, start, length in functions:
            if length > MAX_FN_LINES:
                kind = "func" if path.endswith(".go") else "def"
                problems.append(
                    f"{path}:{start + 1}: {kind} {name} is {length} lines (at most {MAX_FN_LINES})"
                )
    return problems


def python_imports(path, modules):
    """The package modules the module at path imports."""
    targets = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                base = node.module.split(".")[0]
            elif node.level == 0 and (node.module or "").startswith("palisade."):
                base = node.module.split(".")[1]
            elif node.level == 1 or (node.level == 0 and node.module == "palisade"):
                for alias in node.names:
                    targets.add(alias.name if alias.name in modules else "__init__")
                continue
            else:
                continue
            targets.add(base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "palisade":
                    targets.add(parts[1] if len(parts) > 1 else "__init__")
    return targets & set(modules)


def python_circles():
    modules = {
        name[:-3]: os.path.join(PYTHON_PACKAGE, name)
        for name in os.listdir(PYTHON_PACKAGE)
        if name.endswith(".py")
    }
    edges = {m: python_imports(p, modules) - {m} for m, p in modules.items()}
    return [
        f"import circle in {PYTHON_PACKAGE}: " + ", ".join(sorted(modules[m] for m in comp))
        for comp in strongly_connected(edges)
    ]


def strongly_connected(edges):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
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
                sccs.append(comp)

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sccs


def main():
    problems = []
    for root in CRATES:
        if os.path.isdir(root):
            problems += sizes(root)
            problems += circles(root)
    problems += sdk_sizes()
    problems += python_circles()
    for problem in problems:
        print(problem)
    print(f"shape: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
