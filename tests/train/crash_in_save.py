"""Test-only fault injection: `python -m tests.train.crash_in_save STEP CONFIG [overrides]` runs `python -m train`
and dies (os._exit(9), as a kill -9 would) inside the write of the checkpoint of STEP, after every file but the
manifest is written: the folder is left as `.tmp_step_*`."""

import os
import sys

from models import layout
from train.main import main


def crash_at(step: int) -> None:
    real = layout.write_manifest

    def write_manifest(folder):
        if folder.name == layout.TMP_PREFIX + layout.step_name(step):
            os._exit(9)
        return real(folder)

    layout.write_manifest = write_manifest


if __name__ == "__main__":
    crash_at(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
