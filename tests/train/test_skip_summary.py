"""The end-of-run summary of skipped samples by cause: one line on stderr and the last line of metrics.jsonl."""

import json
import logging
import shutil
import tarfile

from tests.train.common import metrics, run, tiny_config


def test_a_truncated_tar_is_counted_named_and_summarised(tmp_path, synthetic, capsys, caplog):
    shards = tmp_path / "shards"
    shards.mkdir()
    source = synthetic["train"].split("{")[0]
    for name in ("00000.tar", "00001.tar"):
        shutil.copy(source + name, shards / name)
    (shards / "sizes.json").write_text(json.dumps({"00000.tar": 64, "00001.tar": 64}))
    with tarfile.open(shards / "00001.tar") as tar:  # break off inside the data of the middle member
        members = tar.getmembers()
        middle = members[len(members) // 2]
        cut = middle.offset_data + max(1, middle.size // 2)
    blob = (shards / "00001.tar").read_bytes()
    (shards / "00001.tar").write_bytes(blob[:cut])
    path = tiny_config(
        tmp_path, synthetic, data={"train_shards": str(shards / "{00000..00001}.tar")}, train={"max_steps": 8}
    )
    with caplog.at_level(logging.WARNING, logger="data.stream"):
        assert run(path) == 0
    last = metrics(tmp_path / "run")[-1]
    assert last["end"] == "done" and last["step"] == 8 and last["samples_seen"] == 128
    assert last["skipped"]["unreadable_tar"] >= 1 and last["skipped_total"] == sum(last["skipped"].values())
    causes = ", ".join(f"{cause} {n}" for cause, n in sorted(last["skipped"].items()) if n)
    line = f"done at step 8 (128 samples): skipped samples: {last['skipped_total']} ({causes})"
    assert line in capsys.readouterr().err.splitlines()
    logged = [r.getMessage() for r in caplog.records if "unreadable_tar" in r.getMessage()]
    assert logged and logged[0].startswith(f"data: skipped the rest of {shards / '00001.tar'} (")
    assert "None" not in logged[0]


def test_a_clean_run_says_none(tmp_path, synthetic, capsys):
    assert run(tiny_config(tmp_path, synthetic, train={"max_steps": 1})) == 0
    assert "done at step 1 (16 samples): skipped samples: none" in capsys.readouterr().err
    last = metrics(tmp_path / "run")[-1]
    assert last["skipped_total"] == 0 and last["captions_truncated"] == 0
    assert set(last) == {
        "step",
        "samples_seen",
        "end",
        "skipped",
        "skipped_total",
        "captions_truncated",
        "captions_truncated_fraction",
    }


def test_captions_cut_to_the_context_are_counted_never_silently(tmp_path, synthetic, capsys):
    """model.context_length 5 leaves room for 3 caption tokens: nearly every synthetic caption is longer and is cut
    as open_clip cuts it; the metrics and the summary line say how many."""
    assert run(tiny_config(tmp_path, synthetic, model={"context_length": 5}, train={"max_steps": 2})) == 0
    records = metrics(tmp_path / "run")
    last, cut = records[-1], records[-1]["captions_truncated"]
    assert 24 <= cut <= 32 and last["captions_truncated_fraction"] == cut / 32
    assert 0 < records[0]["captions_truncated"] <= 16  # step 1's metrics count its own batch
    assert f"; captions cut to the context length: {cut} of 32 ({100 * cut / 32:.1f}%)" in capsys.readouterr().err
