"""Invariant tier: determinism and exact checkpoint/resume."""

import shutil

import pytest
import torch

from tests.conftest import final_checkpoint, run_script, same_parameters

# script and its small-budget flags
CASES = {
    "ppo-sync": ("ppo.py", ["--num-envs", "4", "--num-steps", "32", "--update-epochs", "2", "--num-minibatches", "2"]),
    "ppo-async": (
        "ppo.py",
        [
            "--vector-mode",
            "async",
            "--num-envs",
            "4",
            "--num-steps",
            "32",
            "--update-epochs",
            "2",
            "--num-minibatches",
            "2",
        ],
    ),
}


def _batch(flags: list[str]) -> int:
    return int(flags[flags.index("--num-envs") + 1]) * int(flags[flags.index("--num-steps") + 1])


@pytest.mark.parametrize("case", list(CASES))
def test_resume_continues_exactly(tmp_path, case):
    script, flags = CASES[case]
    total = 8 * _batch(flags)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    run_script(script, *flags, "--total-timesteps", str(total), "--checkpoint-interval", "4", "--run-name", "r", cwd=a)
    mid = tmp_path / "mid.pt"
    shutil.copy(a / "runs/r/checkpoints/ckpt_00000004.pt", mid)

    # A fresh process resumes from iteration 4 and must end exactly where the uninterrupted run did.
    run_script(script, "--resume", str(mid), cwd=b)
    one_go, resumed = final_checkpoint(a / "runs/r"), final_checkpoint(b / "runs/r")
    midway = torch.load(mid, weights_only=True)
    assert one_go["iteration"] == resumed["iteration"] == 8
    assert one_go["global_step"] == resumed["global_step"] == total
    assert not same_parameters(midway["model"], resumed["model"])  # the resumed run did train
    assert same_parameters(one_go["model"], resumed["model"])
    opt_a, opt_b = one_go["optimizer"]["state"], resumed["optimizer"]["state"]
    assert all(same_parameters(opt_a[k], opt_b[k]) for k in opt_a)


def test_same_seed_same_result_other_seed_differs(tmp_path):
    script, flags = CASES["ppo-sync"]
    finals = {}
    for name, seed in (("first", "1"), ("again", "1"), ("other", "2")):
        cwd = tmp_path / name
        cwd.mkdir()
        run_script(
            script, *flags, "--total-timesteps", str(3 * _batch(flags)), "--seed", seed, "--run-name", "r", cwd=cwd
        )
        finals[name] = final_checkpoint(cwd / "runs/r")["model"]
    assert same_parameters(finals["first"], finals["again"])
    assert not same_parameters(finals["first"], finals["other"])
