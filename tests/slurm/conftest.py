"""Fixtures for the Slurm tests: a real one-host cluster (scripts/slurm_local.sh) and stand-in executables.

The cluster fixture installs Debian's Slurm packages and starts 2 virtual nodes when it runs as root with
apt-get; elsewhere it skips with the reason. Once started, a cluster that does not come up is a failure.
"""

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "slurm_local.sh"


def free_base_port(count: int = 3) -> int:
    """A port p with p..p+count-1 free (slurmctld on p, slurmd i on p+i)."""
    for base in range(16817, 17817, 10):
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports for slurmctld/slurmd in 16817..17817")


def run_setup(command: str, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SETUP), command], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running 2-node Slurm cluster; SLURM_CONF is set for this process and everything it starts."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests install and start Slurm, which needs root")
    if not shutil.which("sbatch") and not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    # 4 CPUs per virtual node, whatever the machine has, so the tests' jobs all start at once
    env = {
        **os.environ,
        "SLURM_LOCAL_DIR": str(tmp_path_factory.mktemp("slurm")),
        "SLURM_LOCAL_NODES": "2",
        "SLURM_LOCAL_CPUS": "4",
        "SLURM_LOCAL_PORT": str(free_base_port()),
    }
    installed = run_setup("install", env, timeout=600)
    if installed.returncode != 0:
        pytest.skip(f"installing slurm-wlm/munge failed: {installed.stderr.strip()[-500:]}")
    started = run_setup("up", env, timeout=180)
    if started.returncode != 0:
        run_setup("down", env, timeout=60)
        pytest.fail(f"scripts/slurm_local.sh up failed:\n{started.stderr[-3000:]}")
    conf = started.stdout.strip().split("=", 1)[1]
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield Path(env["SLURM_LOCAL_DIR"])
    finally:
        down = run_setup("down", env, timeout=120)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        assert down.returncode == 0, f"scripts/slurm_local.sh down failed:\n{down.stderr[-2000:]}"


STUBS = {
    # `show hostnames` and `show node` answer as a cluster whose nodes are gpu-001..; `update ... Comment=C` keeps C
    # in $STUB_LOG.comment (it outlives a requeue, as Slurm's does) and `show job` shows it; every call is logged
    "scontrol": """
        echo "scontrol $*" >>"$STUB_LOG"
        case "$1 $2" in
          "show hostnames") for i in $(seq "$SLURM_NNODES"); do printf 'gpu-%03d\\n' "$i"; done ;;
          "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=$3.ib NodeHostName=$3 State=ALLOCATED" ;;
          "show job") echo "JobId=$3 JobName=clip"
                      echo "   Comment=$(cat "$STUB_LOG.comment" 2>/dev/null || echo '(null)')" ;;
        esac
        for a in "$@"; do
          [ "$1" = update ] && [[ "$a" == Comment=* ]] && echo "${a#Comment=}" >"$STUB_LOG.comment"
        done
        exit 0
        """,
    # every node's task, concurrently, as srun does; options are dropped
    "srun": """
        echo "srun $*" >>"$STUB_LOG"
        while [[ "$1" == -* ]]; do shift; done
        pids=()
        for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURMD_NODENAME=gpu-$i "$@" & pids+=($!); done
        rc=0
        for p in "${pids[@]}"; do wait "$p" || rc=$?; done
        exit $rc
        """,
    # logs how it was started; runs until USR1 or TERM (then exits 1 like torchrun) or for STUB_SECONDS
    "torchrun": """
        echo "torchrun $* MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT" >>"$STUB_LOG"
        echo $$ >>"$STUB_LOG.pids"
        trap 'echo "torchrun $SLURM_NODEID got USR1" >>"$STUB_LOG"; exit 1' USR1
        trap 'echo "torchrun $SLURM_NODEID got TERM" >>"$STUB_LOG"; exit 1' TERM
        for ((i = 0; i < ${STUB_SECONDS:-0} * 10; i++)); do sleep 0.1; done
        exit "${STUB_RC:-0}"
        """,
    # scancel --signal=USR1 JOB: signal every task of the job's steps, here the torchrun stubs
    "scancel": """
        echo "scancel $*" >>"$STUB_LOG"
        xargs -r kill -USR1 <"$STUB_LOG.pids"
        """,
    # sbatch --parsable SCRIPT: job ids 1001, 1002, ... and a copy of each script it was given; the submission
    # numbered STUB_SBATCH_FAIL_AT fails as a full queue does
    "sbatch": """
        echo "sbatch $*" >>"$STUB_LOG"
        id=$(( $(ls "$STUB_LOG".job-* 2>/dev/null | wc -l) + 1001 ))
        if [ "$id" = "${STUB_SBATCH_FAIL_AT:-}" ]; then
          echo "sbatch: error: Batch job submission failed: QOSMaxSubmitJobPerUserLimit" >&2
          exit 1
        fi
        cp "${@: -1}" "$STUB_LOG.job-$id"
        echo "$id;cluster"
        """,
}


def write_stubs(folder: Path, names) -> Path:
    folder.mkdir()
    for name in names:
        path = folder / name
        path.write_text("#!/bin/bash\n" + textwrap.dedent(STUBS[name]).lstrip())
        path.chmod(0o755)
    return folder


@pytest.fixture
def stub_bin(tmp_path):
    """A folder of stand-ins for scontrol, srun, torchrun, scancel and sbatch; they log to $STUB_LOG."""
    return write_stubs(tmp_path / "bin", STUBS)


@pytest.fixture
def torchrun_stub(tmp_path):
    """A folder holding only the stand-in torchrun, for jobs on the real cluster."""
    return write_stubs(tmp_path / "torchrun-bin", ["torchrun"])


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> str:
    """512 synthetic samples in 2 shards; returns the brace spec for data.train_shards."""
    out = tmp_path_factory.mktemp("synthetic")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "data.synthetic",
            str(out),
            "--train-samples",
            "512",
            "--shard-size",
            "256",
            "--eval-per-class",
            "1",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return f"{out}/train/{{00000..00001}}.tar"


@pytest.fixture
def fake_sbatch(stub_bin, monkeypatch):
    """sbatch and friends are the stand-ins of stub_bin; returns the file their calls are logged to."""
    monkeypatch.setenv("PATH", f"{stub_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(stub_bin.parent / "calls.log"))
    return stub_bin.parent / "calls.log"
