"""`python -m train ARGS` as a fork of this process, which has imported the trainer once: a study's runs then skip
the 5-10 s of imports (torch, open_clip, transformers) each fresh interpreter spends (docs/profile_step.md), which
on the 2-core machine is a tenth of a tiny run.

The child is what `python -m train ARGS` would be: its own working directory, environment (threads), stdout and
stderr in the run's log, default signal handlers until the trainer installs its own, and its exit code. It is forked
before the parent has run any torch op, so no thread pool is inherited (configs/study/*.yaml `launch: exec` starts
fresh interpreters instead).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from pathlib import Path


class ForkedRun:
    """The part of subprocess.Popen a study uses: pid, returncode, terminate(), wait()."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def terminate(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGTERM)

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def preload() -> None:
    """Import the trainer in the parent (once, before the first fork)."""
    import train.main  # noqa: F401


def redirect_streams() -> None:
    """sys.stdout / sys.stderr (and logging's stream handlers on them) onto file descriptors 1 and 2, which may have
    been other objects in the parent (pytest's capture, for one)."""
    old = {id(sys.stdout), id(sys.stderr), id(sys.__stdout__), id(sys.__stderr__)}
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own stdout)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    for handler in logging.root.handlers:
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
            handler.setStream(sys.stderr)


def fork_train(argv: list[str], cwd: Path, env: dict[str, str], log: Path, threads: int) -> ForkedRun:
    """Fork; the child runs train.main.cli(argv) (argv: the arguments after `-m train`) and exits with its code."""
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedRun(pid)
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        redirect_streams()
        import torch

        torch.set_num_threads(threads)
        from train.main import cli

        sys.argv = [str(cwd / "train" / "__main__.py"), *argv]
        code = cli(argv)
    except SystemExit as e:  # as the interpreter takes it: None is 0, a message is printed and gives 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
