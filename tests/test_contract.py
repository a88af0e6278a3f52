"""The contract every script keeps: CleanRL's command lines, bad input as one line and exit 2, the resume
rule, device choice, checkpoints that cannot lie, and faults that read as one line."""

import importlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from cleanrl_utils import arguments, distributed
from cleanrl_utils.checkpoint import CheckpointError, load_checkpoint
from tests.conftest import (
    REPO,
    SCRIPTS,
    final_checkpoint,
    processes_with_marker,
    read_scalars,
    run_script,
    same_parameters,
    script_env,
    torchrun_cmd,
)

ALL = sorted(p.stem for p in SCRIPTS.glob("*.py") if p.name != "__init__.py")
TORCHRUN = ["ppo_atari_multigpu", "dqn_atari_multigpu", "sac_continuous_action_multigpu", "appo", "appo_atari"]


def parse(script: str, argv: list[str], world_size: int = 1):
    """What the script makes of ``argv`` (CleanRL's spellings included), validated as the script does."""
    module = importlib.import_module(f"cleanrl.{script}")
    args = arguments.parse_args(module.Args, world_size, argv)
    module.validate(args, distributed.Ranks(world_size=world_size, local_world_size=world_size))
    arguments.share_envs(args, world_size)
    return args


# --------------------------------------------------------------------------------------------
# CleanRL's documented command lines keep their meaning
# --------------------------------------------------------------------------------------------
# (script, the flags of a command line from CleanRL's README, docs or benchmark scripts, world size,
# what it must mean here)
CLEANRL_LINES = [
    ("ppo", "--env-id CartPole-v1", 1, {"env_id": "CartPole-v1"}),
    ("ppo", "--no_cuda --track --capture_video", 1, {"cuda": False, "track": True, "capture_video": True}),
    ("ppo", "--env-id CartPole-v1 --total-timesteps 100000 --track --capture_video", 1, {"total_timesteps": 100000}),
    ("ppo_atari", "--env-id BreakoutNoFrameskip-v4 --track --capture_video", 1, {"num_envs": 8, "num_steps": 128}),
    ("ppo_atari_envpool", "--env-id BreakoutNoFrameskip-v4", 1, {"env_id": "BreakoutNoFrameskip-v4"}),
    ("ppo_atari_envpool", "--env-id Breakout-v5 --track --capture_video", 1, {"env_id": "Breakout-v5"}),
    ("ppo_continuous_action", "--env-id Hopper-v4", 1, {"num_steps": 2048, "num_minibatches": 32}),
    (
        "ppo_continuous_action",
        "--exp-name ppo_continuous_action_8M --total-timesteps 8000000 --no_cuda --track",
        1,
        {"exp_name": "ppo_continuous_action_8M", "total_timesteps": 8000000},
    ),
    ("ppo_atari_multigpu", "--env-id BreakoutNoFrameskip-v4", 2, {"num_envs": 16, "local_num_envs": 8}),
    ("ppo_atari_multigpu", "--env-id BreakoutNoFrameskip-v4 --local-num-envs=4", 2, {"num_envs": 8}),
    ("ppo_atari_multigpu", "--local-num-envs 4 --track --capture_video", 2, {"num_envs": 8, "local_num_envs": 4}),
    ("ppo_atari_multigpu", "--env-id BreakoutNoFrameskip-v4 --backend nccl --no-cuda", 2, None),  # exit 2 on a CPU
    ("ppo_atari_multigpu", "--num-envs 8 --num-steps 32 --total-timesteps 256", 2, {"local_num_envs": 4}),
    ("dqn", "--env-id CartPole-v1", 1, {"target_network_frequency": 500, "exploration_steps": 10_000}),
    ("dqn_atari", "--env-id PongNoFrameskip-v4", 1, {"target_network_frequency": 1000, "buffer_size": 1_000_000}),
    ("sac_continuous_action", "--env-id Hopper-v4 --autotune False --alpha 0.2", 1, {"autotune": False, "alpha": 0.2}),
    ("sac_continuous_action", "--track", 1, {"track": True}),
]


@pytest.mark.parametrize(
    "script, line, world_size, meaning", CLEANRL_LINES, ids=[f"{s} {x}" for s, x, *_ in CLEANRL_LINES]
)
@pytest.mark.quick
def test_cleanrl_command_lines_keep_their_meaning(script, line, world_size, meaning, capsys):
    if meaning is None:  # NCCL on a machine without CUDA: one line, exit 2
        with pytest.raises(SystemExit) as e:
            parse(script, line.split(), world_size)
        assert e.value.code == 2 and "--backend nccl: needs CUDA" in capsys.readouterr().err
        return
    args = parse(script, line.split(), world_size)
    assert {k: getattr(args, k) for k in meaning} == meaning


@pytest.mark.parametrize("script", ALL)
def test_wandb_project_is_cleanrls(script):
    assert importlib.import_module(f"cleanrl.{script}").Args().wandb_project_name == "cleanRL"


def test_num_envs_and_local_num_envs_together_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        parse("dqn_atari_multigpu", ["--num-envs", "4", "--local-num-envs", "2"], 2)
    assert e.value.code == 2
    assert "--num-envs 4 and --local-num-envs 2: give one (num_envs = local_num_envs x WORLD_SIZE, here 2)" in (
        capsys.readouterr().err
    )


def test_dqn_target_network_frequency_counts_env_steps(tmp_path):
    """As in CleanRL: the target is a copy of the Q-network made every target_network_frequency env steps."""
    flags = ["--learning-starts", "200", "--train-frequency", "16", "--gradient-steps", "4", "--batch-size", "32"]
    flags += ["--target-network-frequency", "64", "--checkpoint-interval", "0"]
    for total, copied_now in ((256, True), (288, False)):  # 256 = 4 x 64: copied after that step's update
        cwd = tmp_path / str(total)
        cwd.mkdir()
        run_script("dqn.py", *flags, "--total-timesteps", str(total), "--run-name", "r", cwd=cwd)
        ckpt = final_checkpoint(cwd / "runs/r")
        assert same_parameters(ckpt["model"], ckpt["target"]) == copied_now, total


# --------------------------------------------------------------------------------------------
# Bad input: one line naming the value and the rule, exit code 2, and no run directory
# --------------------------------------------------------------------------------------------
# (flags, fragment the single error line must contain)
PPO_RULES = [
    (["--num-envs", "0"], "--num-envs 0: must be a positive integer"),
    (["--num-steps", "-4"], "--num-steps -4: must be a positive integer"),
    (["--update-epochs", "0"], "--update-epochs 0: must be a positive integer"),
    (["--num-minibatches", "3"], "--num-minibatches 3: must divide the batch size num_envs * num_steps = 256"),
    (["--total-timesteps", "100"], "--total-timesteps 100: must be at least one iteration"),
    (["--learning-rate", "0"], "--learning-rate 0.0: must be > 0"),
    (["--gamma", "1.5"], "--gamma 1.5: must be in (0, 1]"),
    (["--gae-lambda", "-0.1"], "--gae-lambda -0.1: must be in [0, 1]"),
    (["--env-timeout", "0"], "--env-timeout 0.0: must be > 0"),
    (["--checkpoint-interval", "-1"], "--checkpoint-interval -1: must be >= 0"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id NoSuchEnv-v0: not a registered gymnasium environment"),
    (["--env-id", "no_such_module:Env-v0"], "--env-id no_such_module:Env-v0: not a registered gymnasium environment"),
    (["--env-id", "Pendulum-v1"], "--env-id Pendulum-v1: needs a discrete action space"),
    (["--resume", "does/not/exist"], "--resume does/not/exist: no such file or directory"),
]


def assert_rejected(proc, fragment: str, cwd) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr
    assert not (cwd / "runs").exists() and not (cwd / "escape").exists()


@pytest.mark.parametrize("flags, fragment", PPO_RULES, ids=[" ".join(f) for f, _ in PPO_RULES])
@pytest.mark.quick
def test_ppo_rejects_bad_input(tmp_path, flags, fragment):
    proc = run_script("ppo.py", *flags, cwd=tmp_path, check=False, timeout=120)
    assert_rejected(proc, fragment, tmp_path)


@pytest.mark.quick
def test_unparseable_flag_exits_2(tmp_path):
    proc = run_script("ppo.py", "--num-envs", "many", cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    assert "--num-envs" in proc.stderr
    assert not (tmp_path / "runs").exists()


OTHER_RULES = [
    ("ppo_atari.py", ["--env-id", "CartPole-v1"], "--env-id CartPole-v1: not an Atari (ALE) environment"),
    ("ppo_atari.py", ["--num-minibatches", "5"], "--num-minibatches 5: must divide the batch size"),
    ("ppo_atari.py", ["--threads", "0"], "--threads 0: must be a positive integer"),
    ("ppo_atari.py", ["--cudagraphs", "--compile"], "--cudagraphs: needs --compile and CUDA"),
    ("ppo_atari_envpool.py", ["--cudagraphs"], "--cudagraphs: needs --compile and CUDA"),
    ("ppo_atari_envpool.py", ["--env-id", "NoSuchGame-v5"], "--env-id NoSuchGame-v5: not an EnvPool task"),
    ("ppo_atari_envpool.py", ["--env-id", "CartPole-v1"], "--env-id CartPole-v1: not an Atari task of EnvPool"),
    ("ppo_atari_envpool.py", ["--vector-mode", "ale", "--env-id", "NoSuchGame-v5"], "not an Atari game of ale-py"),
    (
        "ppo_atari_envpool.py",
        ["--vector-mode", "ale", "--capture-video"],
        "--capture-video: not with --vector-mode ale",
    ),
    ("ppo_atari_envpool.py", ["--total-timesteps", "512"], "--total-timesteps 512: must be at least one iteration"),
    (
        "ppo_continuous_action.py",
        ["--env-id", "CartPole-v1"],
        "--env-id CartPole-v1: needs a continuous (Box) action space",
    ),
    ("ppo_continuous_action.py", ["--clip-obs", "0"], "--clip-obs 0.0: must be > 0"),
    ("ppo_continuous_action.py", ["--num-envs", "0"], "--num-envs 0: must be a positive integer"),
]


# the rules every script shares (cleanrl_utils.arguments.check_run), on every script
OTHER_RULES += [(f"{script}.py", ["--seed", "-1"], "--seed -1: must be in [0, 2**32)") for script in ALL]
OTHER_RULES += [("dqn.py", ["--track"], "--track: W&B's key is read from WANDB_API_KEY only, and it is not set")]
OTHER_RULES += [("ppo.py", ["--run-name", "../escape"], "--run-name ../escape: must be a name (or names joined by /)")]
OTHER_RULES += [("sac_continuous_action.py", ["--run-name", "/tmp/abs"], "--run-name /tmp/abs: must be a name")]


@pytest.mark.parametrize("script, flags, fragment", OTHER_RULES, ids=[f"{s} {' '.join(f)}" for s, f, _ in OTHER_RULES])
@pytest.mark.quick
def test_other_scripts_reject_bad_input(tmp_path, script, flags, fragment):
    env = {"WANDB_MODE": "", "WANDB_API_KEY": ""}  # --track with no key: as a new user has it
    proc = run_script(script, *flags, cwd=tmp_path, check=False, timeout=120, env=env)
    assert_rejected(proc, fragment, tmp_path)


# --------------------------------------------------------------------------------------------
# The resume rule
# --------------------------------------------------------------------------------------------
SMALL_PPO = ["--num-envs", "2", "--num-steps", "32", "--update-epochs", "1", "--num-minibatches", "2"]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A finished 128-step ppo.py run with a checkpoint every 64 steps."""
    cwd = tmp_path_factory.mktemp("ppo_run")
    run_script(
        "ppo.py", *SMALL_PPO, "--total-timesteps", "128", "--checkpoint-interval", "64", "--run-name", "r", cwd=cwd
    )
    return cwd


@pytest.mark.quick
def test_resume_refuses_a_changed_setting(ppo_run, tmp_path):
    proc = run_script("ppo.py", "--resume", str(ppo_run / "runs/r"), "--num-steps", "16", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: --num-steps 16: the checkpoint was trained with 32; --resume keeps the checkpoint's settings; only "
        "--learning-rate, --ent-coef, --vf-coef, --clip-coef, --max-grad-norm, --gamma, --gae-lambda, "
        "--update-epochs, --target-kl may change (drop the flag, or start a new run)"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.mark.quick
def test_resume_may_change_an_allowed_setting_and_the_schedule_follows_it(ppo_run, tmp_path):
    """--resume RUN --learning-rate X (an allow-listed setting): one line says what changed, and the annealed
    learning rate anneals from the new base from the checkpoint's step on."""
    midway = ppo_run / "runs/r/checkpoints/ckpt_00000064.pt"
    proc = run_script("ppo.py", "--resume", str(midway), "--learning-rate", "0.004", cwd=tmp_path)
    assert "--learning-rate 0.004: changed on resume (trained so far with 0.001), from step 64 on" in proc.stderr
    lr = dict(read_scalars(tmp_path / "runs/r")["charts/learning_rate"])
    assert lr[128] == pytest.approx(0.004 * (1 - 1 / 2))  # iteration 2 of 2, from the new base
    assert final_checkpoint(tmp_path / "runs/r")["args"]["learning_rate"] == 0.004


@pytest.mark.quick
def test_a_changed_learning_rate_is_the_optimizers_after_its_state_is_loaded(tmp_path):
    """The optimizer's saved state holds the old learning rate: loading it must not put that one back (the
    new value, not the checkpoint's, is what the constant-rate scripts train with)."""
    flags = ["--no-anneal-lr", "--learning-starts", "64", "--batch-size", "16", "--buffer-size", "1000"]
    flags += ["--checkpoint-interval", "128"]
    run_script("dqn.py", *flags, "--total-timesteps", "128", "--run-name", "r", cwd=tmp_path)
    run_script("dqn.py", "--resume", "runs/r", "--total-timesteps", "256", "--learning-rate", "0.0002", cwd=tmp_path)
    final = final_checkpoint(tmp_path / "runs/r")
    assert final["global_step"] == 256 and final["optimizer"]["param_groups"][0]["lr"] == 0.0002


@pytest.mark.quick
def test_resume_takes_machine_flags_from_the_new_launch_and_may_train_longer(ppo_run, tmp_path):
    midway = ppo_run / "runs/r/checkpoints/ckpt_00000064.pt"
    # the same value of a setting, a machine flag, an output flag and a longer run are all accepted
    proc = run_script(
        "ppo.py", "--resume", str(midway), "--num-envs", "2", "--threads", "2", "--checkpoint-interval", "0",
        "--total-timesteps", "256", cwd=tmp_path,
    )  # fmt: skip
    assert (
        "--total-timesteps 256: the run now ends at step 256 instead of 128; the learning rate now anneals linearly "
        "to 0 at step 256 instead of 128, so at step 64 it rises from 50% to 75% of --learning-rate"
    ) in proc.stderr
    final = final_checkpoint(tmp_path / "runs/r")
    assert final["global_step"] == 256
    assert final["args"]["threads"] == 2 and final["args"]["total_timesteps"] == 256
    lr = dict(read_scalars(tmp_path / "runs/r")["charts/learning_rate"])
    assert lr[128] == pytest.approx(1e-3 * (1 - 1 / 4))  # iteration 2 of 4: the schedule of the new total


@pytest.mark.quick
def test_the_speed_flags_are_the_new_launchs(monkeypatch):
    """--compile, --cudagraphs and --torch-deterministic describe the machine, not the algorithm: a run trained
    with all three on a GPU resumes on a CPU without them (and --compile may be given again, or not)."""
    from cleanrl.ppo_atari import Args

    saved = {"args": {**vars(Args()), "compile": True, "cudagraphs": True, "torch_deterministic": False}}
    args = arguments.resumed_args(arguments.parse_args(Args, 1, ["--resume", "r"]), saved, ["--resume", "r"])
    assert (args.compile, args.cudagraphs, args.torch_deterministic) == (False, False, True)
    args = arguments.resumed_args(arguments.parse_args(Args, 1, ["--compile"]), saved, ["--compile"])
    assert args.compile and not args.cudagraphs


@pytest.mark.quick
def test_resume_cannot_shorten_below_what_was_trained(ppo_run, tmp_path):
    proc = run_script(
        "ppo.py", "--resume", str(ppo_run / "runs/r"), "--total-timesteps", "64", cwd=tmp_path, check=False
    )
    assert proc.returncode == 2
    assert "--total-timesteps 64: the checkpoint has already trained 128 steps" in proc.stderr


@pytest.mark.quick
def test_resume_refuses_another_scripts_checkpoint(ppo_run, tmp_path):
    path = ppo_run / "runs/r/checkpoints/ckpt_00000128.pt"
    proc = run_script("dqn.py", "--resume", str(path), cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert f"error: checkpoint {path} was written by ppo.py, not by dqn.py" in proc.stderr.splitlines()
    assert not (tmp_path / "runs").exists()


def test_a_run_directory_with_checkpoints_is_not_overwritten(ppo_run):
    proc = run_script("ppo.py", *SMALL_PPO, "--total-timesteps", "64", "--run-name", "r", cwd=ppo_run, check=False)
    assert proc.returncode == 2
    assert "error: runs/r holds checkpoints: pass --resume runs/r or another --run-name" in proc.stderr


@pytest.mark.quick
def test_a_second_run_on_a_live_runs_directory_is_refused_and_a_dead_runs_is_taken_over(tmp_path, marker):
    """One live run per run directory (a lock in it): a second launch with the same --run-name is refused
    with one line while the first lives, and once it is killed a launch continues its run."""
    cmd = [sys.executable, str(SCRIPTS / "ppo.py"), "--no-progress", *SMALL_PPO, "--run-name", "r"]
    first = subprocess.Popen([*cmd, "--total-timesteps", "10000000", "--checkpoint-interval", "64"], cwd=tmp_path,
                             env=script_env({"CLEANRL_TEST_MARKER": marker}), stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "runs/r/checkpoints").glob("ckpt_*.pt")):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        second = run_script("ppo.py", *SMALL_PPO, "--run-name", "r", "--resume", "runs/r", cwd=tmp_path, check=False)
        lines = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert second.returncode == 2 and len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert lines[0] == f"error: runs/r is in use by a live run (pid {first.pid} on {socket.gethostname()}): " \
            "wait for it to end, or give another --run-name"  # fmt: skip
    finally:
        first.kill()
        first.wait()
    more = final_checkpoint(tmp_path / "runs/r")["global_step"] + 256
    third = run_script("ppo.py", "--resume", "runs/r", "--total-timesteps", str(more), cwd=tmp_path)
    assert f"done: {more:,} steps" in third.stdout


def test_a_run_ends_with_one_summary_line(ppo_run, tmp_path):
    proc = run_script("ppo.py", *SMALL_PPO, "--total-timesteps", "128", "--run-name", "s", cwd=tmp_path)
    line = proc.stdout.strip().splitlines()[-1]
    pattern = (
        r"done: 128 steps \(128 in [0-9.]+s, [0-9,]+ SPS\); (mean return [0-9.]+ over the last \d+ episodes|no episode ended); "
        r"run runs/s, checkpoint runs/s/checkpoints/ckpt_00000128.pt; tensorboard --logdir runs"
    )
    assert re.fullmatch(pattern, line), line


# --------------------------------------------------------------------------------------------
# Checkpoints that cannot lie
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_a_damaged_checkpoint_is_refused(ppo_run, tmp_path):
    data = bytearray((ppo_run / "runs/r/checkpoints/ckpt_00000128.pt").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(damaged)
    proc = run_script("ppo.py", "--resume", str(damaged), cwd=tmp_path, check=False)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: checkpoint {damaged} is") and "corrupt" in errors[0]


def test_a_checkpoint_of_an_older_layout_is_refused(tmp_path):
    old = tmp_path / "old.pt"
    torch.save({"format_version": 1, "model": {}}, old)
    with pytest.raises(CheckpointError, match=r"has layout version 1, this version of the scripts reads layout 2"):
        load_checkpoint(old)


def _fill(path) -> None:
    """Take every free byte of the filesystem ``path`` is on."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_failed_write_keeps_the_last_checkpoint_and_leaves_no_temporary_file(tmp_path):
    """A write the disk refuses (here: a file size limit, as a full disk would) is one error; nothing is lost."""
    code = f"""
import resource, signal, sys, torch
sys.path.insert(0, {str(REPO)!r})
from cleanrl_utils.checkpoint import CheckpointError, save_checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
save_checkpoint({{"x": torch.zeros(1000)}}, {str(tmp_path)!r}, 1)
try:
    save_checkpoint({{"x": torch.zeros(1_000_000)}}, {str(tmp_path)!r}, 2)
except CheckpointError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"writing checkpoint {tmp_path}/ckpt_00000002.pt failed (")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_00000001.pt"]  # no temporary file left
    assert load_checkpoint(tmp_path / "ckpt_00000001.pt")["x"].shape == (1000,)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB filesystem (tmpfs), so a run can really fill it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_run_with_one_line(small_disk, marker):
    cmd = [sys.executable, str(SCRIPTS / "ppo.py"), "--no-progress", *SMALL_PPO, "--run-name", "r"]
    cmd += ["--total-timesteps", "100000", "--checkpoint-interval", "64"]
    proc = subprocess.Popen(
        cmd, cwd=small_disk, env=script_env({"CLEANRL_TEST_MARKER": marker}), stderr=subprocess.PIPE, text=True
    )
    checkpoints = small_disk / "runs/r/checkpoints"
    deadline = time.monotonic() + 120
    while len(list(checkpoints.glob("ckpt_*.pt"))) < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    _fill(small_disk / "ballast")  # the next checkpoint meets a full disk
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr
    left = sorted(checkpoints.iterdir())
    # the checkpoint or TensorBoard's writer thread meets the full disk first: either names the last good one
    assert re.fullmatch(
        r"error: writing (checkpoint runs/r/checkpoints/ckpt_\d{8}.pt|the TensorBoard log runs/r) failed "
        r"\(No space left on device\); "
        rf"last good checkpoint: runs/r/checkpoints/{left[-1].name}",
        errors[0],
    ), errors[0]
    assert all(p.name.startswith("ckpt_") for p in left)  # no temporary file
    (small_disk / "ballast").unlink()
    load_checkpoint(left[-1])  # intact


def test_a_full_disk_under_the_tensorboard_log_is_one_line_too(small_disk, marker):
    """No checkpoint is due: TensorBoard's writer thread meets the full disk and the main thread says so."""
    cmd = [sys.executable, str(SCRIPTS / "ppo.py"), "--no-progress", *SMALL_PPO, "--run-name", "r"]
    cmd += ["--total-timesteps", "10000000", "--checkpoint-interval", "100000000"]
    proc = subprocess.Popen(
        cmd, cwd=small_disk, env=script_env({"CLEANRL_TEST_MARKER": marker}), stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list((small_disk / "runs/r").glob("events.out.tfevents.*")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    _fill(small_disk / "ballast")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.fullmatch(
        r"error: writing the TensorBoard log runs/r failed \(.+\); last good checkpoint: none", errors[0]
    ), stderr


def test_a_resumed_run_that_meets_a_full_disk_names_the_checkpoint_it_resumed_from(small_disk):
    base = ["--no-progress", *SMALL_PPO, "--run-name", "r", "--checkpoint-interval", "64"]
    run_script("ppo.py", *base, "--total-timesteps", "128", cwd=small_disk)
    _fill(small_disk / "ballast")  # the resumed run's first checkpoint (or log write) meets a full disk
    proc = run_script("ppo.py", "--no-progress", "--resume", "runs/r", "--total-timesteps", "100000", cwd=small_disk,
                      check=False, timeout=120)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0].endswith("; last good checkpoint: runs/r/checkpoints/ckpt_00000128.pt"), errors
    assert "(No space left on device)" in errors[0], errors


def test_a_run_started_on_a_full_disk_is_one_line_and_leaves_no_run_directory(small_disk):
    _fill(small_disk / "ballast")
    proc = run_script("ppo.py", *SMALL_PPO, "--run-name", "r", cwd=small_disk, check=False, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert [e for e in errors if e.startswith("error:")] == [
        "error: writing the TensorBoard log runs/r failed (No space left on device); last good checkpoint: none"
    ], proc.stderr
    assert not (small_disk / "runs/r").exists()


# --------------------------------------------------------------------------------------------
# Devices, and a rank that stops answering
# --------------------------------------------------------------------------------------------
def test_each_local_rank_gets_its_own_gpu(monkeypatch):
    """On CPU, with CUDA faked: the device follows LOCAL_RANK (or --device-ids) in every torchrun script."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for local_rank, device_ids, expected in ((0, None, 0), (1, None, 1), (3, None, 3), (1, [2, 3], 3), (0, [2, 3], 2)):
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.delenv("RANK", raising=False)  # no process group in this test
        device = distributed.Ranks.from_env().join_process_group(True, None, device_ids, 10.0)
        assert device == torch.device("cuda", expected) and chosen[-1] == device
    assert distributed.Ranks.from_env().join_process_group(False, None, [2, 3], 10.0) == torch.device("cpu")
    for script in sorted(p.stem for p in SCRIPTS.glob("*.py") if p.stem != "__init__"):  # no script picks its own
        source = (SCRIPTS / f"{script}.py").read_text()
        assert "args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)" in source, script
        assert 'torch.device("cuda"' not in source, script


@pytest.mark.parametrize(
    "device_ids, local_world_size, backend, message",
    [
        ([0, 0], 2, None, "--device-ids [0, 0]: NCCL needs a different GPU for every process (or use --backend gloo)"),
        ([0, 7], 2, None, "--device-ids [0, 7]: GPU 7 does not exist (this node has 4)"),
        ([0], 2, None, "--device-ids [0]: needs one GPU per local process (LOCAL_WORLD_SIZE=2)"),
        (None, 8, None, "8 processes on this node but only 4 GPUs (use --device-ids or --no-cuda)"),
    ],
)
def test_device_ids_are_checked(monkeypatch, capsys, device_ids, local_world_size, backend, message):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as e:
        distributed.check_devices(SimpleNamespace(cuda=True, backend=backend, device_ids=device_ids), local_world_size)
    assert e.value.code == 2 and capsys.readouterr().err == f"error: {message}\n"
    distributed.check_devices(SimpleNamespace(cuda=True, backend="gloo", device_ids=[0, 0]), 2)  # gloo may share a GPU


class FakeCudaGenerators:
    """``count`` simulated GPUs, each with its own generator state; ``current`` is the device set_device chose."""

    def __init__(self, monkeypatch, count: int, current: int):
        self.count, self.current = count, current
        self.states = {i: torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(count)}
        for name in ("is_available", "is_initialized"):
            monkeypatch.setattr(torch.cuda, name, lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[self.index(device)].clone())
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_state)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.states[i].clone() for i in range(count)])
        monkeypatch.setattr(
            torch.cuda, "set_rng_state_all", lambda states: [self.set_state(s, i) for i, s in enumerate(states)]
        )

    def index(self, device) -> int:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        index = self.current if device.index is None else device.index
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return index

    def set_state(self, state, device="cuda"):
        self.states[self.index(device)] = state.clone()


def test_rng_restores_the_generator_of_the_ranks_device_on_another_gpu_count(monkeypatch):
    """Saved by a rank on GPU 2 of 4, resumed on a machine with one GPU: that GPU gets GPU 2's generator;
    on GPU 5 of 8 only GPU 5's changes; on a machine without a GPU the CPU generators are restored."""
    from cleanrl_utils.checkpoint import rng_state, set_rng_state

    FakeCudaGenerators(monkeypatch, count=4, current=2)
    state = rng_state()
    resumed = FakeCudaGenerators(monkeypatch, count=1, current=0)
    set_rng_state(state)
    assert torch.equal(resumed.states[0], torch.full((16,), 12, dtype=torch.uint8))
    more = FakeCudaGenerators(monkeypatch, count=8, current=5)  # and on GPU 5 of 8: only GPU 5 changes
    set_rng_state(state)
    assert [int(more.states[i][0]) for i in range(8)] == [10, 11, 12, 13, 14, 12, 16, 17]
    cpu_only = FakeCudaGenerators(monkeypatch, count=0, current=0)  # and on a machine without a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.manual_seed(123)
    set_rng_state(state)
    assert torch.equal(torch.get_rng_state(), state["torch"]) and cpu_only.states == {}


def test_device_clock_sums_the_timed_regions_until_read(monkeypatch):
    """perf/*_time: only the time inside ``with clock:`` counts, and each read starts a new interval."""
    from cleanrl_utils import monitor

    now = [100.0]
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: now[0])
    clock = monitor.DeviceClock(torch.device("cpu"))
    for _ in range(3):
        with clock:
            now[0] += 0.5
        now[0] += 7.0  # outside: not counted
    assert clock.read() == 1.5
    with clock:
        now[0] += 0.25
    assert clock.read() == 0.25 and clock.read() == 0.0


def test_a_checkpoint_written_before_a_peer_stops_is_the_last_good_one(tmp_path):
    """Rank 0 wrote the file, then the broadcast that tells the others timed out (a peer stopped): the file on disk
    is complete and a resume takes it, so the error line must name it, not the one before."""
    from types import SimpleNamespace

    from cleanrl_utils.run import Run

    class PeerStopsAfterTheWrite:
        world_size = 2

        def save_collectively(self, write, own, global_step, run_name):
            write([own, own])
            raise RuntimeError("Timed out waiting 8000ms for recv operation to complete")

    written = tmp_path / "ckpt_00000128.pt"
    checkpoints = SimpleNamespace(run_name="r", save=lambda state, step: written)
    run = SimpleNamespace(wandb_id=None, ranks=PeerStopsAfterTheWrite(), checkpoints=checkpoints,
                          last_checkpoint=tmp_path / "ckpt_00000064.pt")  # fmt: skip
    with pytest.raises(RuntimeError, match="Timed out"):
        Run.save(run, {"global_step": 128}, 128, own={"parameters_sha256": "x"})
    assert run.last_checkpoint == written


@pytest.mark.parametrize(
    "script, flags",
    [
        ("ppo_atari_multigpu.py", ["--num-envs", "2", "--num-steps", "32", "--update-epochs", "1"]),
        ("appo.py", ["--num-actors", "1", "--num-envs", "2", "--num-steps", "16", "--update-epochs", "1"]),
    ],
)
def test_a_rank_that_stops_answering_is_named(tmp_path, marker, script, flags):
    """SIGSTOP on rank 1: after --dist-timeout, one line names it and the last good checkpoint."""
    cmd = [*torchrun_cmd(2), str(SCRIPTS / script), "--no-progress", "--no-cuda", *flags]
    cmd += ["--total-timesteps", "10000000", "--checkpoint-interval", "64", "--dist-timeout", "8", "--run-name", "r"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=script_env({"CLEANRL_TEST_MARKER": marker}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not list((tmp_path / "runs/r/checkpoints").glob("ckpt_*.pt")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        rank1 = next(
            p
            for p in processes_with_marker(marker)
            if p.environ().get("RANK") == "1" and script in " ".join(p.cmdline())
        )
        rank1.send_signal(signal.SIGSTOP)
        out, _ = proc.communicate(timeout=150)
    finally:
        for p in processes_with_marker(marker):
            p.send_signal(signal.SIGKILL)
    assert proc.returncode != 0
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out[-3000:]
    last = sorted((tmp_path / "runs/r/checkpoints").glob("ckpt_*.pt"))[-1]
    assert re.fullmatch(
        rf"error: rank 1 stopped answering: no reply within --dist-timeout 8s at step \d+; "
        rf"last good checkpoint: runs/r/checkpoints/{last.name}",
        lines[0],
    ), lines[0]
