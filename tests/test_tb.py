"""The event-file reader the tools share: every point, read incrementally, and a resumed run's
restart marker dropping what the previous attempt logged after its checkpoint."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.tb import ScalarReader, parse_table

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


def test_incremental_and_resumed(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step in range(20_000):  # more than TensorBoard's 10,000-point reservoir sample
        writer.add_scalar("charts/episodic_return", float(step), step)
    writer.flush()
    reader = ScalarReader(tmp_path).update()
    assert reader.get("charts/episodic_return").steps == list(range(20_000))
    writer.add_scalar("charts/episodic_return", -1.0, 20_000)
    writer.close()
    assert reader.update().get("charts/episodic_return").values[-2:] == [19_999.0, -1.0]  # only the new point
    assert len(reader.get("charts/episodic_return").steps) == 20_001

    resumed = SummaryWriter(str(tmp_path), purge_step=15_000)  # a resume from the checkpoint at step 15,000
    resumed.add_scalar("charts/episodic_return", 7.0, 15_000)
    resumed.close()
    series = ScalarReader(tmp_path).update().get("charts/episodic_return")
    assert series.steps == [*range(15_000), 15_000] and series.values[-1] == 7.0
    assert reader.update().get("charts/episodic_return").steps == [*range(15_000), 15_000]


def test_parse_table():
    text = "|param|value|\n|-|-|\n|seed|1|\n|env_id|CartPole-v1|\n|note|a|b|"
    assert parse_table(text) == {"seed": "1", "env_id": "CartPole-v1", "note": "a|b"}
