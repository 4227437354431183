"""Hostile file contents for the tests that check nothing on disk is trusted."""

import os
import pickle


class RunsCode:
    """Unpickling this runs `touch MARKER`: what a file that executes code on load would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def code_pickle(marker) -> bytes:
    """A pickle that creates `marker` if anything ever unpickles it without weights_only."""
    return pickle.dumps(RunsCode(marker))
