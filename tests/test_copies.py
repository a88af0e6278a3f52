"""Code copied between scripts (each script stays self-contained) stays identical, and is algorithm only.

The groups are found from the code, not from a list:

* every module-level function or class of ``cleanrl/*.py`` (but ``Args``, ``validate`` and ``main``,
  which every script has for itself) is grouped with the definitions of the same name and the same
  docstring in the other scripts: code that says it is the same thing must be the same code. A
  variant says how it differs in its docstring (or has another name);
* inside ``main()``, the code under each section comment (``# ROLLOUT``, ``# UPDATE: ...``, up to
  the next section comment; and the code before the first one) is grouped with the sections under
  the same comment in the other scripts. Generic comments (``# CHECKPOINT``) head quite different code in different families, so
  here only near-copies count: code that is 90% the same as another script's section under the same
  comment is a copy that must be identical; a variant section says how it differs in its comment.

Every group must be identical, and copied code (a group of two or more scripts) must not be
plumbing: signals, checkpoint files, logging set-up, process groups and object collectives belong
in cleanrl_utils/.
"""

import ast
import difflib
import functools
import re
from collections import defaultdict

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)

PER_SCRIPT = {"Args", "validate", "main"}
SECTION = re.compile(r"^\s*# [A-Z][A-Z]{2,}")  # "# ROLLOUT", "# UPDATE: ...", "# ENV SETUP"
# what plumbing does itself (calls into cleanrl_utils, such as ranks.save_checkpoint(...), are fine)
PLUMBING = re.compile(
    r"\bsignal\.|SummaryWriter|\bwandb\.|torch\.(save|load)\(|(?<![.\w])(save|load)_checkpoint\(|init_process_group"
    r"|TCPStore|_object(_list)?\(|\bsys\.exit|\btyro\.|(?<![.\w])(Progress|ResourceMonitor)\("
)


def _code(lines: list[str]) -> str:
    """Code lines without comments, blank lines or indentation (a section moved into a block is the same code)."""
    out = []
    for line in lines:
        line = line.split("  # ")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return "\n".join(out)


def scripts() -> list[str]:
    return sorted(p.name for p in SCRIPTS.glob("*.py") if p.name != "__init__.py")


@functools.cache
def groups() -> dict[str, dict[str, str]]:
    """group key -> {script: code}. Keys: ``def <name>: <docstring>`` and ``main <section comment>``."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for script in scripts():
        source = (SCRIPTS / script).read_text()
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name not in PER_SCRIPT:
                found[f"def {node.name}: {ast.get_docstring(node)}"][script] = ast.unparse(node)
            if isinstance(node, ast.FunctionDef) and node.name == "main":
                body = lines[node.lineno : node.end_lineno]
                starts = [i for i, line in enumerate(body) if SECTION.match(line)] + [len(body)]
                found["main (before the first section)"][script] = _code(body[: starts[0]])
                for a, b in zip(starts, starts[1:]):
                    found[f"main {body[a].strip()}"][script] = _code(body[a + 1 : b])
    return found


NEAR = 0.9  # main() sections under the same comment that are this similar are copies


def _clusters(members: dict[str, str]) -> list[dict[str, str]]:
    """Split a main() section group into clusters of near-copies (single-linkage at NEAR)."""
    clusters: list[dict[str, str]] = []
    for script, code in sorted(members.items()):
        near = [c for c in clusters if any(difflib.SequenceMatcher(None, code, o).ratio() >= NEAR for o in c.values())]
        merged = {script: code}
        for c in near:
            merged.update(c)
            clusters.remove(c)
        clusters.append(merged)
    return clusters


@functools.cache
def copied() -> dict[str, dict[str, str]]:
    """The groups of two or more scripts: definitions by name and docstring, main() sections by near-copies."""
    out = {}
    for key, members in groups().items():
        parts = _clusters(members) if key.startswith("main ") else [members]
        for i, part in enumerate(p for p in parts if len(p) > 1):
            out[key if i == 0 else f"{key} ({i + 1})"] = part
    return out


def test_the_groups_are_found():
    found = copied()
    # the maths and models the scripts share, and sections of main() (guards the finder itself)
    for key in ("def compute_gae", "def minibatch_loss", "def minibatches", "def all_reduce_mean_", "def td_target",
                "def critic_loss", "def td_loss", "main # UPDATE"):  # fmt: skip
        assert any(k.startswith(key) for k in found), key
    assert (
        len(found["def all_reduce_mean_: " + ast.get_docstring(_def("ppo_atari_multigpu.py", "all_reduce_mean_"))]) == 5
    )
    print(f"\n{len(found)} groups of copies:")
    for key, members in sorted(found.items()):
        print(f"  {key.splitlines()[0][:90]}: {', '.join(sorted(members))}")


def _def(script: str, name: str) -> ast.AST:
    return next(n for n in ast.parse((SCRIPTS / script).read_text()).body if getattr(n, "name", None) == name)


@pytest.mark.parametrize("key", sorted(copied()), ids=lambda k: k.splitlines()[0][:60])
def test_copies_are_identical(key):
    members = copied()[key]
    reference_script, reference = next(iter(sorted(members.items())))
    for script, code in sorted(members.items()):
        diff = "\n".join(difflib.unified_diff(reference.splitlines(), code.splitlines(), reference_script, script))
        assert code == reference, f"{key.splitlines()[0]} differs between {reference_script} and {script}:\n{diff}"


@pytest.mark.parametrize("key", sorted(copied()), ids=lambda k: k.splitlines()[0][:60])
def test_copies_are_not_plumbing(key):
    code = next(iter(copied()[key].values()))
    found = [m.group(0) for m in PLUMBING.finditer(code)]
    assert not found, (
        f"{key.splitlines()[0]} is copied in {sorted(copied()[key])} and does {found}: move it to cleanrl_utils/"
    )
