"""Script sizes against the style guide's budget, and how much of each variant is its idea.

    python benchmark/script_sizes.py

The style guide (STYLE.md, "Principles") says a script reads in one sitting: about 400 lines
single-process, about 500 distributed. Here that is measured as the lines of code and comments after
the module docstring (the docstring is the script's manual; blank lines cost nothing), and "about"
as at most 10% over: 440 and 550. Lines are not bought by density: at most 8 lines over 110
characters per script (CleanRL and LeanRL have 2-8; ``cleanrl/ruff.toml`` formats code at 110).
One row per single-process/variant pair gives the lines ``diff -w`` changes (both sides counted):
at most 220. Exits 1 if a budget is exceeded; tests/test_layout.py asserts the same figures.
"""

import ast
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "cleanrl"
DISTRIBUTED = {"ppo_atari_multigpu", "dqn_atari_multigpu", "sac_continuous_action_multigpu", "appo", "appo_atari"}
PAIRS = [
    ("ppo", "ppo_atari"),
    ("ppo_atari", "ppo_atari_multigpu"),
    ("dqn_atari", "dqn_atari_multigpu"),
    ("sac_continuous_action", "sac_continuous_action_multigpu"),
]
STYLE_GUIDE = {False: 400, True: 500}  # "about" this many lines: single-process, distributed
LINE_BUDGET = {distributed: round(lines * 1.1) for distributed, lines in STYLE_GUIDE.items()}
LONG, LONG_BUDGET = 110, 8  # characters; lines longer than that per script
DIFF_BUDGET = 220


def changed_lines(a: str, b: str) -> int:
    """``diff -w cleanrl/<a>.py cleanrl/<b>.py | grep -c '^[<>]'``."""
    out = subprocess.run(
        ["diff", "-w", SCRIPTS / f"{a}.py", SCRIPTS / f"{b}.py"], capture_output=True, text=True
    ).stdout
    return sum(line.startswith(("<", ">")) for line in out.splitlines())


def code_lines(source: str) -> int:
    """Non-blank lines after the module docstring."""
    tree = ast.parse(source)
    first = tree.body[0]
    start = first.end_lineno if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else 0
    return sum(1 for line in source.splitlines()[start:] if line.strip())


def measure() -> tuple[list[tuple[str, int, int, int]], list[tuple[str, str, int, int]]]:
    """([(script, code lines, budget, lines over 110 characters)], [(single, variant, changed lines, budget)])."""
    sizes = []
    for p in sorted(SCRIPTS.glob("*.py")):
        if p.name != "__init__.py":
            source = p.read_text()
            long = sum(len(line) > LONG for line in source.splitlines())
            sizes.append((p.stem, code_lines(source), LINE_BUDGET[p.stem in DISTRIBUTED], long))
    return sizes, [(a, b, changed_lines(a, b), DIFF_BUDGET) for a, b in PAIRS]


def main() -> int:
    sizes, pairs = measure()
    print(
        f"| script | code lines | budget | lines over {LONG} chars (at most {LONG_BUDGET}) | |\n|---|---|---|---|---|"
    )
    for name, lines, budget, long in sizes:
        verdict = "ok" if lines <= budget and long <= LONG_BUDGET else "OVER"
        print(f"| {name}.py | {lines} | {budget} | {long} | {verdict} |")
    print("\n| pair (diff -w, changed lines) | lines | budget | |\n|---|---|---|---|")
    for a, b, changed, budget in pairs:
        print(f"| {a}.py -> {b}.py | {changed} | {budget} | {'ok' if changed <= budget else 'OVER'} |")
    over = [s for s in sizes if s[1] > s[2] or s[3] > LONG_BUDGET] + [p for p in pairs if p[2] > p[3]]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
