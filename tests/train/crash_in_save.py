"""Test-only fault injection: `python -m tests.train.crash_in_save STEP CONFIG [overrides]` runs `python -m train`
and dies (os._exit(9), as a kill -9 would) inside the write of the checkpoint of STEP, after every file but the
manifest is written: the folder is left as `.tmp_step_*`."""

import os
import sys

from models import run_folder
from train.main import main


def crash_at(step: int) -> None:
    real = run_folder.write_manifest

    def write_manifest(folder):
        if folder.name == run_folder.TMP_PREFIX + run_folder.step_name(step):
            os._exit(9)
        return real(folder)

    run_folder.write_manifest = write_manifest


if __name__ == "__main__":
    crash_at(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
