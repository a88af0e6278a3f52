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
    sizes, pairs = _sizes()
    assert len(sizes) == 12
    print()
    for name, lines, budget in sizes:
        print(f"{name}.py: {lines} lines (budget {budget})")
    for a, b, changed, budget in pairs:
        print(f"diff -w {a}.py {b}.py: {changed} changed lines (budget {budget})")
    assert [s for s in sizes if s[1] > s[2]] == []
    assert [p for p in pairs if p[2] > p[3]] == []
