"""Unit tier: the PPO maths against values worked out by hand."""

import numpy as np
import pytest
import torch

from cleanrl.ppo import compute_gae, ppo_loss


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


def test_ppo_loss_at_ratio_one_is_minus_mean_advantage():
    adv = torch.tensor([1.0, -2.0, 3.0])
    logp = torch.tensor([-0.1, -0.2, -0.3])
    value = torch.tensor([1.0, 2.0, 3.0])
    pg, v = ppo_loss(logp, logp, adv, value, value, value + 2.0, 0.2, clip_vloss=True)
    assert pg.item() == pytest.approx(-2.0 / 3.0)
    assert v.item() == pytest.approx(0.5 * 4.0)


def test_ppo_loss_clipping():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([2.0, -2.0, 2.0, -2.0])
    pg, _ = ppo_loss(new, old, adv, torch.zeros(4), torch.zeros(4), torch.zeros(4), 0.2, clip_vloss=False)
    # ratio 1.5, A>0: clipped to 1.2 -> -2.4;  ratio 1.5, A<0: unclipped -> +3.0
    # ratio 0.5, A>0: unclipped -> -1.0;       ratio 0.5, A<0: clipped to 0.8 -> +1.6
    assert pg.item() == pytest.approx((-2.4 + 3.0 - 1.0 + 1.6) / 4)


def test_value_loss_clipping():
    old, new, ret = torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])
    _, clipped = ppo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), new, old, ret, 0.2, clip_vloss=True)
    _, plain = ppo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), new, old, ret, 0.2, clip_vloss=False)
    assert clipped.item() == pytest.approx(0.5 * (1.2 - 3.0) ** 2)  # the clipped value is further off
    assert plain.item() == pytest.approx(0.5 * 1.0)
