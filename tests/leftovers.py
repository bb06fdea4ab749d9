"""What testbed leaves in /tmp: the SSH control folders (``tbcm-<uid>-*``) of testbeds, found by their owner."""

from __future__ import annotations

from pathlib import Path

from testbed import remote, ssh


def control_dirs_under(root: Path) -> list[Path]:
    """The SSH control folders in /tmp of testbeds whose folders lie under ``root``."""
    return [d for d, owner in ssh.control_dirs() if owner is not None and owner.is_relative_to(root)]


def remove_control_dirs_under(root: Path) -> list[Path]:
    """Stop the master connections of, and remove, the control folders of testbeds under ``root``."""
    found = control_dirs_under(root)
    for d in found:
        remote.remove_control_dir(d)
    return found


SLURM_USED: list[bool] = []
"""Set by the slurm_cluster fixture: this session started Slurm daemons (so its end looks for any left)."""


def slurm_daemons() -> list[str]:
    """Slurm and munge daemons running in another network namespace than this process ('pid name' each): a
    Slurm test's cluster must leave none once its local hosts are gone (the machine's own munged, which
    Debian's package starts where systemd runs, is not the tests')."""
    import os

    out = []
    own = os.stat("/proc/self/ns/net").st_ino
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            net = os.stat(d / "ns" / "net").st_ino
        except OSError:
            continue
        if net != own and comm in ("slurmctld", "slurmd", "slurmstepd", "munged"):
            out.append(f"{d.name} {comm}")
    return out
