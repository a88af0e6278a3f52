"""Unit tier: the PPO maths against values worked out by hand."""

import numpy as np
import pytest
import torch

from cleanrl.ppo import compute_gae

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


def test_gae_with_termination_and_truncation():
    gamma, lam = 0.9, 0.5
    # env 0 terminates at t=1; env 1 is truncated at t=1. Under next-step autoreset t=2 is the
    # reset step, so values[2] is the value of the real final observation of the first episode.
    rewards = np.array([[1, 1], [2, 1], [3, 1], [4, 1]], dtype=np.float32)
    values = np.array([[0.5, 1], [1.0, 2], [1.5, 3], [2.0, 4]], dtype=np.float32)
    next_value = np.array([3.0, 5.0], dtype=np.float32)
    terminations = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=np.float32)
    dones = np.array([[0, 0], [1, 1], [0, 0], [0, 0]], dtype=np.float32)

    advantages, returns = compute_gae(rewards, values, next_value, terminations, dones, gamma, lam)

    # env 0, by hand (gamma * lambda = 0.45):
    #   t=3: 4 + 0.9*3.0 - 2.0 = 4.7
    #   t=2: 3 + 0.9*2.0 - 1.5 = 3.3;   3.3 + 0.45*4.7 = 5.415
    #   t=1: terminated: 2 + 0 - 1.0 = 1.0 (recursion cut)
    #   t=0: 1 + 0.9*1.0 - 0.5 = 1.4;   1.4 + 0.45*1.0 = 1.85
    # env 1:
    #   t=3: 1 + 0.9*5 - 4 = 1.5
    #   t=2: 1 + 0.9*4 - 3 = 1.6;       1.6 + 0.45*1.5 = 2.275
    #   t=1: truncated, bootstraps from the final observation's value 3: 1 + 0.9*3 - 2 = 1.7 (cut)
    #   t=0: 1 + 0.9*2 - 1 = 1.8;       1.8 + 0.45*1.7 = 2.565
    expected = np.array([[1.85, 2.565], [1.0, 1.7], [5.415, 2.275], [4.7, 1.5]], dtype=np.float32)
    np.testing.assert_allclose(advantages, expected, rtol=1e-6)
    np.testing.assert_allclose(returns, expected + values, rtol=1e-6)


def test_gae_lambda_one_is_discounted_return_minus_value():
    rewards = np.ones((5, 1), dtype=np.float32)
    values = np.zeros((5, 1), dtype=np.float32)
    zeros = np.zeros((5, 1), dtype=np.float32)
    advantages, _ = compute_gae(rewards, values, np.array([10.0], np.float32), zeros, zeros, 0.5, 1.0)
    # 1 + .5 + .25 + .125 + .0625 + .5**5 * 10
    assert advantages[0, 0] == pytest.approx(1.9375 + 0.3125)


class FixedPolicy:
    """Stands in for a script's Agent in minibatch_loss: evaluate() returns the given log-probs and values."""

    def __init__(self, newlogprob, newvalue, entropy=None):
        self.out = (newlogprob, torch.zeros_like(newlogprob) if entropy is None else entropy, newvalue)

    def evaluate(self, obs, actions):
        return self.out


def _loss(newlogprob, oldlogprob, adv, newvalue, oldvalue, returns, clip_vloss=True, weights=None):
    """minibatch_loss (the PPO family's) on one minibatch of hand-made rows; returns its statistics."""
    from cleanrl.ppo import minibatch_loss

    n = len(adv)
    w = torch.ones(n) if weights is None else weights
    mb = {"obs": torch.zeros(n, 1), "actions": torch.zeros(n), "logprobs": oldlogprob, "advantages": adv,
          "values": oldvalue, "returns": returns, "weights": w / w.sum()}  # fmt: skip
    coefs = {"clip_coef": 0.2, "clip_vloss": clip_vloss, "ent_coef": 0.0, "vf_coef": 0.5}
    return minibatch_loss(FixedPolicy(newlogprob, newvalue), mb, **coefs)[1]


def test_ppo_loss_at_ratio_one_is_minus_mean_advantage():
    adv = torch.tensor([1.0, -2.0, 3.0])
    logp = torch.tensor([-0.1, -0.2, -0.3])
    value = torch.tensor([1.0, 2.0, 3.0])
    stats = _loss(logp, logp, adv, value, value, value + 2.0)
    assert stats["policy_loss"].item() == pytest.approx(-2.0 / 3.0)
    assert stats["value_loss"].item() == pytest.approx(0.5 * 4.0)
    assert stats["approx_kl"].item() == 0.0 and stats["clipfrac"].item() == 0.0


def test_ppo_loss_clipping():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([2.0, -2.0, 2.0, -2.0])
    stats = _loss(new, old, adv, torch.zeros(4), torch.zeros(4), torch.zeros(4), clip_vloss=False)
    # ratio 1.5, A>0: clipped to 1.2 -> -2.4;  ratio 1.5, A<0: unclipped -> +3.0
    # ratio 0.5, A>0: unclipped -> -1.0;       ratio 0.5, A<0: clipped to 0.8 -> +1.6
    assert stats["policy_loss"].item() == pytest.approx((-2.4 + 3.0 - 1.0 + 1.6) / 4)
    assert stats["clipfrac"].item() == 1.0  # every ratio is 0.5 away from 1


def test_value_loss_clipping():
    old, new, ret = torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])
    zero = torch.zeros(1)
    clipped = _loss(zero, zero, zero, new, old, ret, clip_vloss=True)["value_loss"]
    plain = _loss(zero, zero, zero, new, old, ret, clip_vloss=False)["value_loss"]
    assert clipped.item() == pytest.approx(0.5 * (1.2 - 3.0) ** 2)  # the clipped value is further off
    assert plain.item() == pytest.approx(0.5 * 1.0)


def test_a_reset_step_weighs_nothing():
    """A row that weighs 0 (a step that only reset its env) moves no mean, whatever it holds."""
    adv, logp, value = torch.tensor([1.0, -2.0, 500.0]), torch.tensor([-0.1, -0.2, -9.0]), torch.tensor([1.0, 2.0, 7.0])
    stats = _loss(logp, logp, adv, value, value, value + 2.0, weights=torch.tensor([1.0, 1.0, 0.0]))
    assert stats["policy_loss"].item() == pytest.approx(0.5)
    assert stats["value_loss"].item() == pytest.approx(0.5 * 4.0)


def _reference_ppo_loss(newlogprob, oldlogprob, advantages, newvalue, oldvalue, returns, clip_coef, clip_vloss):
    """The clipped surrogate and value losses as ppo.py computed them before fixed-size minibatches."""
    ratio = (newlogprob - oldlogprob).exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        return pg_loss, 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    return pg_loss, 0.5 * ((newvalue - returns) ** 2).mean()


COEFS = {"clip_coef": 0.1, "clip_vloss": True, "ent_coef": 0.01, "vf_coef": 0.5}
STATS = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")


def _old_update_loss(agent, mb, *, norm_adv, clip_coef, clip_vloss, ent_coef, vf_coef):
    """The update ppo.py and ppo_continuous_action.py had before fixed-size minibatches (and the Atari scripts
    before them): the reset steps are dropped from the batch (a boolean index), plain means, advantages
    normalised over what is left."""
    keep = mb["weights"] > 0
    sel = {k: v[keep] for k, v in mb.items()}
    newlogprob, entropy, newvalue = agent.evaluate(sel["obs"], sel["actions"])
    logratio = newlogprob - sel["logprobs"]
    ratio = logratio.exp()
    adv = sel["advantages"]
    if norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss, v_loss = _reference_ppo_loss(newlogprob, sel["logprobs"], adv, newvalue, sel["values"], sel["returns"], clip_coef,
                               clip_vloss)  # fmt: skip
    entropy_loss = entropy.mean()
    stats = [pg_loss, v_loss, entropy_loss, (-logratio).mean(), ((ratio - 1) - logratio).mean()]
    stats.append(((ratio - 1.0).abs() > clip_coef).float().mean())
    return pg_loss - ent_coef * entropy_loss + v_loss * vf_coef, dict(zip(STATS, (x.detach() for x in stats)))


def _agent_and_inputs(script: str, rows: int, g: torch.Generator):
    """The script's own network, and observations and actions of its kind for ``rows`` rows."""
    if script == "ppo_atari.py":
        from cleanrl.ppo_atari import Agent

        obs = torch.randint(0, 256, (rows, 4, 84, 84), dtype=torch.uint8, generator=g)
        return Agent(4), obs, torch.randint(0, 4, (rows,), generator=g)
    if script == "ppo.py":
        from cleanrl.ppo import Agent

        return Agent(4, 2), torch.randn(rows, 4, generator=g), torch.randint(0, 2, (rows,), generator=g)
    from cleanrl.ppo_continuous_action import Agent

    return Agent(17, 6), torch.randn(rows, 17, generator=g), torch.randn(rows, 6, generator=g)


def _minibatch(script: str, rows: int, valid_rows: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    agent, obs, actions = _agent_and_inputs(script, rows, g)
    mb = {
        "obs": obs,
        "actions": actions,
        "logprobs": -torch.rand(rows, generator=g) * 2 - 0.5,
        "advantages": torch.randn(rows, generator=g),
        "returns": torch.randn(rows, generator=g),
        "values": torch.randn(rows, generator=g),
        "weights": torch.zeros(rows),
    }
    mb["weights"][valid_rows] = 1.0
    reset = mb["weights"] == 0  # what a reset step holds must not count: make it loud
    mb["advantages"][reset], mb["returns"][reset], mb["logprobs"][reset] = 1e3, -1e3, -9.0
    return agent, mb


PPO_SCRIPTS = ["ppo.py", "ppo_continuous_action.py", "ppo_atari.py"]


@pytest.mark.parametrize("script", PPO_SCRIPTS)
@pytest.mark.parametrize("norm_adv, clip_vloss", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("valid_rows", [[0, 1, 2, 4, 5, 7, 8, 9, 10], [3]], ids=["9 of 12", "1 of 12"])
def test_the_fixed_size_update_equals_the_update_on_the_transitions_alone(script, norm_adv, clip_vloss, valid_rows):
    """Every PPO script trains on fixed-size minibatches whose reset steps weigh 0 (no data-dependent shapes);
    loss, gradients and logged statistics equal those of the old update, which dropped the reset steps."""
    from cleanrl.ppo_atari import minibatch_loss, minibatches

    agent, mb = _minibatch(script, 12, valid_rows)
    coefs = COEFS | {"clip_vloss": clip_vloss}
    with torch.no_grad():  # old policy a little away from the current one, so that some ratios are clipped
        mb["logprobs"] += agent.evaluate(mb["obs"], mb["actions"])[0] + 0.2 * torch.randn(12)
    (epoch,) = minibatches(mb, 1, norm_adv)  # the whole batch in one minibatch, in a random order
    results = []
    for loss_fn, batch, kwargs in ((minibatch_loss, epoch, {}), (_old_update_loss, mb, {"norm_adv": norm_adv})):
        agent.zero_grad()
        loss, stats = loss_fn(agent, batch, **coefs, **kwargs)
        loss.backward()
        results.append((loss.detach(), stats, [p.grad.clone() for p in agent.parameters()]))
    (loss, stats, grads), (ref_loss, ref_stats, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert list(stats) == list(STATS)  # by name, in the order they are logged
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-6)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-6)
    assert stats["clipfrac"] > 0  # some ratios are clipped: the clipped branches are compared too


def test_a_minibatch_of_reset_steps_only_is_a_zero_loss():
    from cleanrl.ppo_atari import minibatch_loss, minibatches

    agent, mb = _minibatch("ppo_atari.py", 4, [])
    loss, stats = minibatch_loss(agent, minibatches(mb, 1, norm_adv=True)[0], **COEFS)
    loss.backward()
    assert loss.item() == 0.0 and all(value.item() == 0.0 for value in stats.values())
    assert all(torch.count_nonzero(p.grad) == 0 for p in agent.parameters())


def test_an_epoch_of_minibatches_covers_every_row_once_and_normalises_each_over_its_transitions():
    from cleanrl.ppo import minibatches

    torch.manual_seed(0)
    rows = 24
    batch = {"index": torch.arange(rows), "advantages": torch.randn(rows) * 3 + 5, "weights": torch.ones(rows)}
    batch["weights"][[1, 2, 7, 11, 12, 13, 20]] = 0.0  # reset steps
    batch["advantages"][batch["weights"] == 0] = 1e3
    epoch = minibatches(batch, 4, norm_adv=True)
    assert [len(mb["index"]) for mb in epoch] == [6] * 4
    assert sorted(torch.cat([mb["index"] for mb in epoch]).tolist()) == list(range(rows))
    for mb in epoch:
        real = batch["weights"][mb["index"]] > 0
        assert mb["weights"].sum().item() == pytest.approx(1.0) and torch.all(mb["weights"][~real] == 0)
        adv = mb["advantages"][real]
        assert adv.mean().item() == pytest.approx(0.0, abs=1e-6) and adv.std().item() == pytest.approx(1.0, rel=1e-5)
    (plain,) = minibatches(batch, 1, norm_adv=False)
    assert torch.equal(plain["advantages"], batch["advantages"][plain["index"]])
