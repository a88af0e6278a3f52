"""The scripts stay within the style guide's budget, and a data-parallel variant's diff is its idea."""

import importlib.util

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


def _sizes():
    spec = importlib.util.spec_from_file_location("script_sizes", REPO / "benchmark/script_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure()


def test_scripts_are_within_budget():
    """STYLE.md's "about 400 / about 500 lines" (code and comments after the module docstring, at most 10%
    over), at most 8 lines over 110 characters each, and a variant's diff against its base within 220 lines."""
    sizes, pairs = _sizes()
    assert len(sizes) == 12
    print()
    for name, lines, budget, long in sizes:
        print(f"{name}.py: {lines} code lines (budget {budget}), {long} lines over 110 characters")
    for a, b, changed, budget in pairs:
        print(f"diff -w {a}.py {b}.py: {changed} changed lines (budget {budget})")
    assert [s for s in sizes if s[1] > s[2]] == []
    assert [s for s in sizes if s[3] > 8] == []
    assert [p for p in pairs if p[2] > p[3]] == []


PLUMBING = {"actors", "arguments", "atari_wrappers", "buffers", "checkpoint", "distributed", "envs", "monitor",
            "nan_guard", "param_server", "reshard", "run", "tb"}  # fmt: skip
TOOLS = {
    "benchmark",
    "pbt",
    "enjoy",
    "launch",
    "plot",
    "scores",
    "submit_exp",
    "trials",
    "tuner",
    "tuner_spaces",
    "tuner_worker",
}


def _imports() -> dict[str, set[str]]:
    """cleanrl_utils module -> the cleanrl_utils modules it imports (anywhere in the file)."""
    import ast

    graph = {}
    for path in sorted((REPO / "cleanrl_utils").glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cleanrl_utils":
                parts = node.module.split(".")
                found |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("cleanrl_utils.")}
        graph[path.stem] = found - {path.stem}
    return graph


def test_plumbing_imports_no_tool_and_no_module_imports_itself_back():
    graph = _imports()
    assert set(graph) - {"__init__"} == PLUMBING | TOOLS, "a new module: say whether it is plumbing or a tool"
    assert {m: graph[m] & TOOLS for m in PLUMBING if graph[m] & TOOLS} == {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph.get(module, ())):
            if dep in path:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in done:
                visit(dep, [*path, dep])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        visit(module, [module])
    assert cycles == []
