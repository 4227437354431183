"""The evaluation suite as one job on the real 2-node Slurm cluster (the slurm_cluster fixture): one process per
node, each reading half of every set, gives the numbers of one process."""

import contextlib
import io
import json
import re

import yaml

from eval import suite
from tests.eval import evalsets
from tests.slurm.test_cluster import assert_completed, job_output, wait_for
from train.submit import main


def test_suite_job_on_two_nodes_equals_one_process(slurm_cluster, tmp_path):
    folder = evalsets.synthetic_eval(tmp_path / "synthetic", per_class=3)
    pairs = evalsets.caption_pairs(tmp_path / "pairs", count=7)
    (tmp_path / "suite.yaml").write_text(
        yaml.safe_dump({"datasets": {"shapes": str(folder), "pairs": str(pairs / "wds")}})
    )
    run = evalsets.tiny_run(tmp_path / "run")
    resources = ["--nodes", "2", "--procs-per-node", "1", "--gpus-per-node", "0", "--partition", "debug"]
    # 2 shared cores are slow with more than one thread per process
    resources += ["--time", "10", "--sbatch-arg=--export=ALL,OMP_NUM_THREADS=1,CUDA_VISIBLE_DEVICES="]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["suite", str(run), "--suite", str(tmp_path / "suite.yaml"), "--workers", "0", *resources])
    job_id = re.search(r"submitted job (\d+)", out.getvalue()).group(1)
    logs = run / "eval"
    assert_completed(wait_for(job_id, logs, timeout=240), job_id, logs)
    assert "on 2 node(s) x 1 process(es)" in job_output(job_id, logs)
    one = [str(run), "--suite", str(tmp_path / "suite.yaml"), "--out", str(tmp_path / "one"), "--workers", "0"]
    for expected in suite.main([*one, "--device", "cpu"]):
        got = json.loads((logs / "step_00000005" / f"{expected['dataset']}.json").read_text())
        assert got["world_size"] == 2 and expected["world_size"] == 1
        for key in ("top1", "top5", "mean_per_class_recall", "text_to_image_R@1", "image_to_text_R@5"):
            assert got.get(key) == expected.get(key), (expected["dataset"], key)
        assert (got["num_images"], got["skipped"]) == (expected["num_images"], expected["skipped"])
