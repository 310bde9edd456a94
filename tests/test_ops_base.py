"""The backend contract (engine/ops/base.py): both backends declare every member with its signature.

CupyBackend is read from its source with `ast` (its class and the mixins it names), so the GPU
backend is checked on any machine, without importing CuPy.
"""
import ast
import inspect
from pathlib import Path

from engine.ops import base
from engine.ops.base import Backend
from engine.ops.numpy_backend import NumpyBackend

OPS = Path(base.__file__).resolve().parent

_KIND = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}


def contract() -> tuple[dict[str, list[tuple]], set[str]]:
    """The Protocol's methods as [(name, kind, default source)] and its data members."""
    methods = {}
    for name, f in vars(Backend).items():
        if inspect.isfunction(f) and not name.startswith("_"):
            methods[name] = [(p.name, p.kind, None if p.default is p.empty else repr(p.default))
                             for p in inspect.signature(f).parameters.values()]
    return methods, set(Backend.__annotations__)


def ast_params(f: ast.FunctionDef) -> list[tuple]:
    a = f.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = [(p.arg, _KIND["posonlyargs" if p in a.posonlyargs else "args"], d) for p, d in zip(positional, defaults)]
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, None))
    out += [(p.arg, inspect.Parameter.KEYWORD_ONLY, None if d is None else ast.unparse(d))
            for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, None))
    return out


def source_members(source: str, cls: str, modules: dict[str, str]) -> tuple[dict[str, list[tuple]], set[str]]:
    """Methods and data members of class `cls` in `source`, its bases included where they come from
    `from .module import Base` with the module's source in `modules` (nearest class first)."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    methods: dict[str, list[tuple]] = {}
    attrs: set[str] = set()
    imported = {alias.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1
                for alias in n.names}
    for b in reversed(node.bases):  # bases first, so the class's own members override
        if isinstance(b, ast.Name) and imported.get(b.id) in modules:
            m, a = source_members(modules[imported[b.id]], b.id, modules)
            methods.update(m)
            attrs |= a
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and any(isinstance(d, ast.Name) and d.id == "property"
                                                     for d in item.decorator_list):
            attrs.add(item.name)  # a property is a data member of the contract
        elif isinstance(item, ast.FunctionDef):
            methods[item.name] = ast_params(item)
            if item.name == "__init__":
                attrs |= {t.attr for s in ast.walk(item) if isinstance(s, (ast.Assign, ast.AnnAssign))
                          for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                          if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        elif isinstance(item, ast.Assign):
            attrs |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and item.value is not None and isinstance(item.target, ast.Name):
            attrs.add(item.target.id)
    return methods, attrs


def mismatches(methods: dict[str, list[tuple]], attrs: set[str]) -> list[str]:
    want_methods, want_attrs = contract()
    out = [f"{name}: missing" for name in want_methods if name not in methods]
    out += [f"{name}: {methods[name]} != {sig}" for name, sig in want_methods.items()
            if name in methods and methods[name] != sig]
    return out + [f"{name}: data member missing" for name in want_attrs if name not in attrs]


def cupy_sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in OPS.glob("cupy_*.py")}


def test_cupy_backend_declares_the_whole_contract():
    modules = cupy_sources()
    assert mismatches(*source_members(modules["cupy_backend"], "CupyBackend", modules)) == []


def test_numpy_backend_declares_the_whole_contract():
    methods = {name: [(p.name, p.kind, None if p.default is p.empty else repr(p.default))
                      for p in inspect.signature(getattr(NumpyBackend, name)).parameters.values()]
               for name in contract()[0] if hasattr(NumpyBackend, name)}
    attrs = {name for name in Backend.__annotations__ if hasattr(NumpyBackend, name)}
    assert mismatches(methods, attrs) == []


def test_the_check_sees_a_missing_member_a_changed_default_and_a_missing_attribute():
    modules = cupy_sources()
    src = modules["cupy_backend"].replace("def linear(self, x, w, pad_to: int = 0, fp16: bool = False,",
                                          "def linear(self, x, w, pad_to: int = 1, fp16: bool = False,")
    src = src.replace("def graph_stats(self)", "def graph_statistics(self)")
    src = src.replace('kv_stores = ("bf16", "fp8")', "")
    assert src != modules["cupy_backend"]
    found = mismatches(*source_members(src, "CupyBackend", modules))
    assert any(f.startswith("linear:") for f in found)
    assert "graph_stats: missing" in found
    assert "kv_stores: data member missing" in found
    mixin = modules["cupy_qwen3_5"].replace("def moe_route(self, logits, top_k: int, shared_gate=None):",
                                            "def moe_route(self, logits, k: int, shared_gate=None):")
    found = mismatches(*source_members(modules["cupy_backend"], "CupyBackend", {**modules, "cupy_qwen3_5": mixin}))
    assert any(f.startswith("moe_route:") for f in found)
