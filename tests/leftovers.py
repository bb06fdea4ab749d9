"""What testbed leaves in /tmp: the SSH control folders (``tbcm-<uid>-*``) of testbeds, found by their owner."""

from __future__ import annotations

from pathlib import Path

from testbed import ssh


def control_dirs_under(root: Path) -> list[Path]:
    """The SSH control folders in /tmp of testbeds whose folders lie under ``root``."""
    return [d for d, owner in ssh.control_dirs() if owner is not None and owner.is_relative_to(root)]


def remove_control_dirs_under(root: Path) -> list[Path]:
    """Stop the master connections of, and remove, the control folders of testbeds under ``root``."""
    found = control_dirs_under(root)
    for d in found:
        ssh.remove_control_dir(d)
    return found
