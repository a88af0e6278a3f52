"""Unit tier: the hand-written distributions and targets against torch.distributions and hand values,
and the Atari life/FIRE wrappers on a real game."""

import math

import ale_py
import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import (
    AffineTransform,
    Categorical,
    Independent,
    Normal,
    TanhTransform,
    TransformedDistribution,
)

from cleanrl.dqn import td_target
from cleanrl.ppo import Agent as CategoricalAgent
from cleanrl.ppo_continuous_action import Agent as GaussianAgent
from cleanrl.ppo_continuous_action import gaussian_log_prob
from cleanrl.sac_continuous_action import Actor, SoftQNetworks, critic_loss, policy_loss, soft_q_target
from cleanrl_utils.atari_wrappers import wrap_atari

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)

gym.register_envs(ale_py)


def test_categorical_log_prob_and_entropy():
    torch.manual_seed(0)
    agent = CategoricalAgent(4, 5)
    x, actions = torch.randn(64, 4) * 3, torch.randint(0, 5, (64,))
    log_prob, entropy, _ = agent.evaluate(x, actions)
    reference = Categorical(logits=agent.actor(x))
    torch.testing.assert_close(log_prob, reference.log_prob(actions))
    torch.testing.assert_close(entropy, reference.entropy())


def test_gumbel_max_samples_follow_the_softmax():
    """Chi-square test of 60,000 samples of Agent.act against the policy's probabilities (5 actions)."""
    torch.manual_seed(1)
    agent = CategoricalAgent(4, 5)
    with torch.no_grad():  # a fixed, uneven policy: the last layer outputs these logits for any input
        agent.actor[-1].weight.zero_()
        agent.actor[-1].bias.copy_(torch.tensor([1.5, 0.0, -1.0, 0.5, -2.0]))
    n = 60_000
    actions, log_prob, _ = agent.act(torch.zeros(n, 4))
    probs = torch.softmax(agent.actor[-1].bias, 0)
    counts = torch.bincount(actions, minlength=5).double()
    chi2 = (((counts - n * probs) ** 2) / (n * probs)).sum().item()
    assert chi2 < 18.47, (counts, n * probs)  # the 0.999 quantile of chi-square with 4 degrees of freedom
    torch.testing.assert_close(log_prob, probs.log()[actions].float())


def test_diagonal_gaussian_log_prob_and_entropy():
    torch.manual_seed(2)
    agent = GaussianAgent(3, 2)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[0.3, -0.7]]))
    x, actions = torch.randn(32, 3), torch.randn(32, 2)
    log_prob, entropy, _ = agent.evaluate(x, actions)
    reference = Independent(Normal(agent.actor_mean(x), agent.actor_logstd.exp().expand(32, 2)), 1)
    torch.testing.assert_close(log_prob, reference.log_prob(actions))
    torch.testing.assert_close(entropy, reference.entropy())
    mean, logstd = torch.randn(8, 2), torch.randn(8, 2)
    torch.testing.assert_close(
        gaussian_log_prob(actions[:8], mean, logstd), Independent(Normal(mean, logstd.exp()), 1).log_prob(actions[:8])
    )


def test_sac_squashed_log_prob_matches_the_transformed_distribution():
    """log pi(a|s) of a = scale * tanh(u) + bias, u ~ N(mean, std): the change of variables SAC uses."""
    torch.manual_seed(3)
    low, high = np.array([-2.0, 0.0], np.float32), np.array([2.0, 3.0], np.float32)
    actor = Actor(5, low, high)
    obs = torch.randn(256, 5) * 0.5
    action, log_prob = actor(obs)
    deterministic = actor.greedy(obs)
    mean, log_std = actor.gaussian(obs)
    squashed = TransformedDistribution(
        Normal(mean, log_std.exp()), [TanhTransform(), AffineTransform(actor.action_bias, actor.action_scale)]
    )
    torch.testing.assert_close(log_prob, Independent(squashed, 1).log_prob(action), rtol=1e-4, atol=1e-3)
    assert ((action >= torch.from_numpy(low)) & (action <= torch.from_numpy(high))).all()
    torch.testing.assert_close(deterministic, torch.tanh(mean) * actor.action_scale + actor.action_bias)


def _separate_critics(twin: SoftQNetworks) -> list[torch.nn.Sequential]:
    """Two ordinary MLP critics (nn.Linear, ReLU) holding the batched network's weights."""
    critics = []
    for i in range(2):
        layers = [torch.nn.Linear(*twin.w1[i].shape), torch.nn.Linear(*twin.w2[i].shape), torch.nn.Linear(256, 1)]
        with torch.no_grad():
            for layer, w, b in zip(
                layers, (twin.w1[i].T, twin.w2[i].T, twin.w3[i]), (twin.b1[i, 0], twin.b2[i, 0], twin.b3[i])
            ):
                layer.weight.copy_(w), layer.bias.copy_(b)
        critics.append(torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2]))
    return critics


def test_batched_critics_equal_two_separate_critics():
    """SAC's twin critics as one batched network: outputs, both losses and every gradient (weights, biases and
    the action's, which trains the actor) equal those of two separate MLPs with the same weights; and the
    batched network starts from the weights two separately made critics would have."""
    torch.manual_seed(0)
    twin, twin_target, actor = SoftQNetworks(11, 3), SoftQNetworks(11, 3), Actor(11, -np.ones(3), np.ones(3))
    torch.manual_seed(0)
    made_apart = [
        torch.nn.Sequential(torch.nn.Linear(14, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 1))
        for _ in range(2)
    ]
    for critic, reference in zip(_separate_critics(twin), made_apart):
        for mine, theirs in zip(critic[::2], reference):
            assert torch.equal(mine.weight, theirs.weight) and torch.equal(mine.bias, theirs.bias)

    critics, targets = _separate_critics(twin), _separate_critics(twin_target)
    obs, next_obs, actions = torch.randn(64, 11), torch.randn(64, 11), torch.rand(64, 3) * 2 - 1
    data = {"obs": obs, "actions": actions, "next_obs": next_obs, "rewards": torch.randn(64),
            "terminations": torch.rand(64) < 0.2}  # fmt: skip
    q_values = twin(obs, actions)
    for i, critic in enumerate(critics):
        torch.testing.assert_close(q_values[i], critic(torch.cat([obs, actions], 1)).squeeze(1))

    # the critics' loss: one target for both, MSE(Q1) + MSE(Q2), and its gradient of every weight and bias
    torch.manual_seed(1)
    loss, _ = critic_loss(actor, twin, twin_target, data, alpha=0.2, gamma=0.99)
    loss.backward()
    torch.manual_seed(1)
    with torch.no_grad():
        next_actions, next_log_prob = actor(next_obs)
        next_q = [t(torch.cat([next_obs, next_actions], 1)).squeeze(1) for t in targets]
        target = soft_q_target(data["rewards"], *next_q, next_log_prob, data["terminations"].float(), 0.2, 0.99)
    x = torch.cat([obs, actions], 1)
    reference = sum(torch.nn.functional.mse_loss(c(x).squeeze(1), target) for c in critics)
    reference.backward()
    torch.testing.assert_close(loss, reference)
    for i, critic in enumerate(critics):
        grads = [
            twin.w1.grad[i].T,
            twin.b1.grad[i, 0],
            twin.w2.grad[i].T,
            twin.b2.grad[i, 0],
            twin.w3.grad[i],
            twin.b3.grad[i],
        ]
        expected = [p.grad for layer in critic[::2] for p in (layer.weight, layer.bias)]
        for mine, theirs in zip(grads, expected):
            torch.testing.assert_close(mine, theirs)

    # the actor's loss goes through min(Q1, Q2) of a sampled action: its gradient of the actor's weights
    twin.requires_grad_(False)
    torch.manual_seed(2)
    loss, _ = policy_loss(actor, twin, obs, 0.2, None, -3.0, autotune=False)
    batched = torch.autograd.grad(loss, list(actor.parameters()))
    torch.manual_seed(2)
    pi, log_pi = actor(obs)
    q = torch.min(*(c(torch.cat([obs, pi], 1)).squeeze(1) for c in critics))
    separate = torch.autograd.grad((0.2 * log_pi - q).mean(), list(actor.parameters()))
    for mine, theirs in zip(batched, separate):
        torch.testing.assert_close(mine, theirs)


def test_td_target_by_hand():
    # 3 transitions: a termination, a truncation (bootstraps from the final observation) and a plain one.
    rewards = torch.tensor([1.0, 2.0, 0.5])
    terminations = torch.tensor([1.0, 0.0, 0.0])
    next_q_target = torch.tensor([[10.0, 20.0], [3.0, 4.0], [7.0, 1.0]])
    next_q_online = torch.tensor([[0.0, 1.0], [5.0, 0.0], [0.0, 9.0]])  # the online net prefers 1, 0, 1
    gamma = 0.9
    double = td_target(rewards, next_q_target, next_q_online, terminations, gamma)
    # Double DQN: the online net picks, the target net values: 1 (cut), 2 + .9 * 3, .5 + .9 * 1
    torch.testing.assert_close(double, torch.tensor([1.0, 2.0 + 0.9 * 3.0, 0.5 + 0.9 * 1.0]))
    plain = td_target(rewards, next_q_target, None, terminations, gamma)
    # DQN: the max of the target net: 1 (cut), 2 + .9 * 4, .5 + .9 * 7
    torch.testing.assert_close(plain, torch.tensor([1.0, 2.0 + 0.9 * 4.0, 0.5 + 0.9 * 7.0]))


def test_soft_q_target_by_hand():
    rewards, terminations = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 1.0])
    q1, q2, next_log_prob = torch.tensor([5.0, 8.0]), torch.tensor([4.0, 9.0]), torch.tensor([-1.5, 0.3])
    target = soft_q_target(rewards, q1, q2, next_log_prob, terminations, alpha=0.2, gamma=0.99)
    # 1 + .99 * (min(5, 4) - .2 * -1.5) = 1 + .99 * 4.3;  the second one terminated: -1
    torch.testing.assert_close(target, torch.tensor([1.0 + 0.99 * 4.3, -1.0]))


class RawScore(gym.Wrapper):
    """The unclipped score of the current game, from the emulator's own rewards."""

    score = 0.0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += reward
        return obs, reward, terminated, truncated, info


def test_a_lost_life_ends_the_training_episode_but_not_the_game():
    """EpisodicLifeEnv and FireResetEnv on real Breakout: 5 lives are 5 training episodes of one game,
    and the game's statistics span all of them."""
    raw = RawScore(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="grayscale"))
    env = wrap_atari(raw)
    env.action_space.seed(0)
    env.reset(seed=0)
    ale = env.unwrapped.ale
    assert ale.lives() == 5
    life_ends, steps, clipped = 0, 0, 0.0
    while True:
        frame = ale.getEpisodeFrameNumber()
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps, clipped = steps + 1, clipped + reward
        assert reward in (0.0, 1.0)  # clipped to its sign
        if not (terminated or truncated):
            continue
        if "episode" in info:  # game over: the score and length of the whole game
            assert ale.lives() == 0 and life_ends == 4
            assert info["episode"]["r"] == raw.score >= clipped and info["episode"]["l"] >= steps
            break
        life_ends += 1  # a lost life: the training episode ends, the game goes on
        lives = ale.lives()
        assert lives == 5 - life_ends
        env.reset()
        assert ale.lives() == lives and ale.getEpisodeFrameNumber() > frame  # same game, FIRE pressed
    assert steps > 50


@pytest.mark.parametrize("std", [0.1, 1.0])
def test_gaussian_log_prob_is_a_density(std):
    """It integrates to 1 over a fine 1-d grid (guards the constant term)."""
    grid = torch.linspace(-8 * std, 8 * std, 20001).unsqueeze(-1)
    density = gaussian_log_prob(grid, torch.zeros(1, 1), torch.full((1, 1), math.log(std))).exp()
    assert torch.trapezoid(density, grid.squeeze(-1)).item() == pytest.approx(1.0, abs=1e-4)
