"""train/forked.py: a study's run as a fork of the study's process behaves as `python -m train` would."""

import os

from train.forked import fork_train
from train.study import REPO


def test_a_forked_run_logs_and_exits_as_python_m_train(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    bad = fork_train(["configs/demo.yaml", "optim.lr=-1"], REPO, env, tmp_path / "bad.log", 1)
    assert bad.wait() == 1
    assert (tmp_path / "bad.log").read_text().startswith("error: ")  # the one line python -m train prints
    missing = fork_train(["no/such.yaml"], REPO, env, tmp_path / "missing.log", 1)
    assert missing.wait() == 1 and "no/such.yaml" in (tmp_path / "missing.log").read_text()
    assert os.getcwd() != "/" and bad.returncode == 1  # the parent is untouched; wait() keeps the code
