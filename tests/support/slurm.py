"""A real single-node SLURM cluster for the tests: ``slurmctld`` and ``slurmd`` (Debian's
``slurmctld``/``slurmd``/``slurm-client`` packages) in the foreground, with their own config, state
and spool folders under a temporary folder and ports chosen free. No munge: ``auth/none`` (one
machine, root only). Jobs run as root. A requeued job waits for its credential to expire before it
runs again (120 s by default): 10 s here (``AuthInfo=cred_expire``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pace import scaled

_DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue", "sinfo")


def missing_slurm() -> str | None:
    """Why a real SLURM cannot run here, or None."""
    absent = [name for name in _DAEMONS if shutil.which(name) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurmctld slurmd slurm-client)"
    if os.geteuid() != 0:
        return "slurmd needs root"
    return None


class SlurmCluster:
    """The two daemons; :meth:`run` runs a SLURM command against them."""

    def __init__(self, folder: Path) -> None:
        from eagle3_raw.launching.reference import free_port

        self.folder = folder
        for sub in ("state", "spool", "log"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        self.conf = folder / "slurm.conf"
        self.conf.write_text(_config(folder, socket.gethostname().split(".")[0], free_port(), free_port()))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons = [
            subprocess.Popen([shutil.which(name) or name, "-D", *flags], env=self.env,
                             stdout=(folder / "log" / f"{name}.out").open("wb"), stderr=subprocess.STDOUT)
            for name, flags in (("slurmctld", ["-c", "-i"]), ("slurmd", []))
        ]  # fmt: skip

    def run(self, *command: str, check: bool = True) -> str:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=scaled(60))
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: {done.stderr}{self.logs()}")
        return done.stdout

    def wait_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-o", "%T", check=False).split()
            if states and all(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states):
                return
            time.sleep(0.5)
        raise AssertionError(f"the SLURM node never became idle{self.logs()}")

    def job_state(self, job: str) -> str:
        """``JobState`` of ``job`` (an id, or ``<array id>_<task>``) as ``scontrol`` shows it."""
        text = self.run("scontrol", "show", "job", job, check=False)
        for word in text.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def logs(self) -> str:
        return "".join(
            f"\n--- {p.name}:\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted((self.folder / "log").glob("*"))
        )

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False)
        for daemon in self.daemons:
            daemon.terminate()
        for daemon in self.daemons:
            try:
                daemon.wait(scaled(20))
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def _config(folder: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=e3test
SlurmctldHost={node}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/none
AuthInfo=cred_expire=10
CredType=cred/none
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MinJobAge=600
KillWait=10
NodeName={node} CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running single-node SLURM (skipped, with the reason, where it cannot run: the stand-in
    test runs the same job scripts there)."""
    reason = missing_slurm()
    if reason is not None:
        pytest.skip(f"no real SLURM here: {reason}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.wait_idle()
        yield cluster
    finally:
        cluster.stop()
