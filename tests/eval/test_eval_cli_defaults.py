"""What the evaluation CLIs (eval.zeroshot, eval.retrieval) do without being told (issue 49): loader workers that fit
the machine, one line for a model path that is not there, and a note when the text positions are resampled."""

import pytest

from eval import checkpoint, retrieval, zeroshot
from tests.eval import evalsets

GIVE = "give a run folder, a checkpoint folder, or an open_clip weights file with --open-clip-model NAME"


@pytest.mark.parametrize("cli", [zeroshot, retrieval], ids=["zeroshot", "retrieval"])
@pytest.mark.parametrize("cpus,workers", [(1, 0), (2, 1), (3, 2), (16, 4)])
def test_workers_default_to_what_the_machine_has(cli, cpus, workers, monkeypatch, capsys):
    """min(4, usable CPUs - 1): a 2-core machine gets 1 worker, so torch's "might get DataLoader running slow or even
    freeze" warning has no cause; the --help text says the rule and this machine's number."""
    monkeypatch.setattr(checkpoint.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert cli.parse_args(["run", "--dataset", "set"]).workers == workers
    assert cli.parse_args(["run", "--dataset", "set", "--workers", "3"]).workers == 3
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default: min(4, usable CPUs - 1), {workers} on this machine)" in help_text


@pytest.mark.parametrize("cli", [zeroshot, retrieval], ids=["zeroshot", "retrieval"])
def test_a_path_that_does_not_exist_is_one_line_with_the_closest_name(cli, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "big").mkdir()
    monkeypatch.chdir(tmp_path)
    for typo, expected in [
        ("runs/tinyy", f"error: runs/tinyy does not exist (did you mean runs/tiny?); {GIVE}"),
        ("runs/zzz", f"error: runs/zzz does not exist; {GIVE}"),
        ("nowhere/tiny", f"error: nowhere/tiny does not exist; {GIVE}"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            cli.main([typo, "--dataset", str(tmp_path), "--device", "cpu", "--workers", "0"])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip() == expected


def test_an_open_clip_weights_file_typo_names_the_closest_file(tmp_path, monkeypatch, capsys):
    evalsets.tiny_checkpoint(tmp_path / "tiny-s.safetensors")
    monkeypatch.chdir(tmp_path)
    argv = ["--open-clip-model", "tiny-s", "--checkpoint", "tiny-s.safetensor", "--dataset", ".", "--device", "cpu"]
    with pytest.raises(SystemExit):
        zeroshot.main(argv)
    assert capsys.readouterr().err.strip() == (
        "error: tiny-s.safetensor does not exist (did you mean tiny-s.safetensors?); "
        "give an open_clip weights file (.safetensors, .pt, .bin)"
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return evalsets.tiny_run(root / "run"), evalsets.caption_pairs(root / "pairs", count=4, broken=None)


def test_another_context_length_is_said_on_stderr(tiny, tmp_path, capsys):
    """tiny-s is trained with 32 text positions: --context-length 48 stretches the table, and the CLI says so in one
    line on stderr; at the trained length (or without the flag) nothing is said."""
    run, pairs = tiny
    base = ["--dataset", str(pairs / "pairs.tsv"), "--device", "cpu", "--workers", "0"]
    note = "note: text positions resampled from 32 to 48 (the model was trained with 32)"
    retrieval.main([str(run), *base, "--context-length", "48"])
    assert note in capsys.readouterr().err.splitlines()
    weights = evalsets.tiny_checkpoint(tmp_path / "tiny-s.safetensors")
    retrieval.main(["--open-clip-model", "tiny-s", "--checkpoint", str(weights), *base, "--context-length", "48"])
    assert note in capsys.readouterr().err.splitlines()
    for flags in ([], ["--context-length", "32"]):
        retrieval.main([str(run), *base, *flags])
        assert "note:" not in capsys.readouterr().err
