"""Log lines of a run: the project's INFO lines on stderr (rank 0) and in RUN/out.log, the progress bar on the
console only (issue 49)."""

import logging
import re

from tests.train.common import run, save_teacher, tiny_config
from train.log import LOG_FILE, Console, console_logging, file_logging

RESAMPLED = "pretrained: visual.positional_embedding resampled from (17, 64) to (26, 64) (bicubic, class token kept)"


def test_a_runs_info_lines_show_on_stderr_and_in_its_log_file(tmp_path, synthetic, capsys):
    """tiny-s weights (32 px, a 4 x 4 grid) loaded at 40 px (5 x 5): the position table is resampled, which
    models/pretrained.py logs at INFO; the bar is on, and stays out of the file."""
    weights = save_teacher(tmp_path / "tiny-s.safetensors")
    config = tiny_config(tmp_path, synthetic, model={"image_size": 40, "pretrained": str(weights)})
    assert run(config, "train.max_steps=2", "train.progress=true") == 0
    err = capsys.readouterr().err
    text = (tmp_path / "run" / LOG_FILE).read_text()
    for line in (RESAMPLED, f"run folder: {tmp_path / 'run'}", "done at step 2 (32 samples): skipped samples: none"):
        assert line in re.split("[\r\n]", err) and f": {line}\n" in text  # a line of its own beside the bar
    assert " INFO models.pretrained: " + RESAMPLED in text
    assert "\r" in err and "\r" not in text and "step/s" not in text
    left = [
        h for h in logging.getLogger().handlers if isinstance(h, Console) or LOG_FILE in getattr(h, "baseFilename", "")
    ]
    assert not left  # the next run in this process logs to its own folder
    assert run(config, "train.max_steps=3") == 0  # resumed: the same file, appended to
    text = (tmp_path / "run" / LOG_FILE).read_text()
    assert text.count("run folder: ") == 4 and "resumed from " in text and "done at step 3 " in text


def test_other_ranks_show_warnings_only_and_write_no_file(tmp_path, capsys):
    log = logging.getLogger("models.pretrained")
    with console_logging(main=False), file_logging(None):
        log.info("not on this rank")
        log.warning("on every rank")
    with console_logging(main=True), file_logging(tmp_path / "out.log"):
        log.info("on rank 0")
        logging.getLogger("some.library").info("another library's info line")
    log.info("after the run")
    assert capsys.readouterr().err == "warning: on every rank\non rank 0\n"
    assert (tmp_path / "out.log").read_text().endswith(" INFO models.pretrained: on rank 0\n")
    assert logging.getLogger("models").level == logging.NOTSET
