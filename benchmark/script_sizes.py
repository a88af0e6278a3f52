"""Script sizes against the style guide's budget, and how much of each data-parallel variant is its idea.

    python benchmark/script_sizes.py

Prints one row per script (lines, budget: 420 single-process, 560 distributed or asynchronous) and one
row per single/data-parallel pair (lines changed by ``diff -w``, both sides counted, budget 220); exits
1 if any budget is exceeded. tests/test_layout.py asserts the same figures.
"""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "cleanrl"
DISTRIBUTED = {"ppo_atari_multigpu", "dqn_atari_multigpu", "sac_continuous_action_multigpu", "appo", "appo_atari"}
PAIRS = [
    ("ppo_atari", "ppo_atari_multigpu"),
    ("dqn_atari", "dqn_atari_multigpu"),
    ("sac_continuous_action", "sac_continuous_action_multigpu"),
]
LINE_BUDGET = {False: 420, True: 560}
DIFF_BUDGET = 220


def changed_lines(a: str, b: str) -> int:
    """``diff -w cleanrl/<a>.py cleanrl/<b>.py | grep -c '^[<>]'``."""
    out = subprocess.run(
        ["diff", "-w", SCRIPTS / f"{a}.py", SCRIPTS / f"{b}.py"], capture_output=True, text=True
    ).stdout
    return sum(line.startswith(("<", ">")) for line in out.splitlines())


def measure() -> tuple[list[tuple[str, int, int]], list[tuple[str, str, int, int]]]:
    """([(script, lines, budget)], [(single, variant, changed lines, budget)])."""
    sizes = [
        (p.stem, len(p.read_text().splitlines()), LINE_BUDGET[p.stem in DISTRIBUTED])
        for p in sorted(SCRIPTS.glob("*.py"))
        if p.name != "__init__.py"
    ]
    return sizes, [(a, b, changed_lines(a, b), DIFF_BUDGET) for a, b in PAIRS]


def main() -> int:
    sizes, pairs = measure()
    print("| script | lines | budget | |\n|---|---|---|---|")
    for name, lines, budget in sizes:
        print(f"| {name}.py | {lines} | {budget} | {'ok' if lines <= budget else 'OVER'} |")
    print("\n| pair (diff -w, changed lines) | lines | budget | |\n|---|---|---|---|")
    for a, b, changed, budget in pairs:
        print(f"| {a}.py -> {b}.py | {changed} | {budget} | {'ok' if changed <= budget else 'OVER'} |")
    over = [s for s in sizes if s[1] > s[2]] + [p for p in pairs if p[2] > p[3]]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
