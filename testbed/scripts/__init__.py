"""Remote shell scripts, shipped as package files (``testbed/scripts/*.sh``, checked by shellcheck in ``make lint``).

Each script is a plain program that takes its parameters as positional arguments (run it by hand with
``sh testbed/scripts/poll.sh RUN_DIR 0``). :func:`program` puts the arguments in front of its text as one
``set -- 'a' 'b'`` line, each word shell-quoted, so that the text can travel on a shell's stdin (``bash -s``) or
base64-encoded (:func:`testbed.remote.sh`) and no parameter is ever pasted into shell code. The function that
builds each call sits next to the parser of its output (``listing_script``/``parse_listing``,
``facts_script``/``parse_fact_lines``, ``poll_command``/``parse_poll``).

Scripts are read from the installed package only, never from the working directory: they run on hosts.
"""

from __future__ import annotations

import shlex
from functools import cache
from importlib import resources

from testbed.distribution import install_command
from testbed.errors import TestbedError


@cache
def text(name: str) -> str:
    """The text of ``testbed/scripts/<name>``."""
    try:
        return (resources.files(__name__) / name).read_text(encoding="utf-8")
    except OSError:
        raise TestbedError(f"the remote script {name} is missing from the testbed package",
                           where=f"testbed/scripts/{name}",
                           fix=f"reinstall testbed ({install_command(reinstall=True)}, or pip install -e . "
                               "from a checkout)") from None


def program(name: str, *args: object) -> str:
    """Script ``name`` with ``args`` as its positional parameters: ``set -- 'arg' ...`` (each quoted), then its text."""
    return " ".join(["set --", *(shlex.quote(str(a)) for a in args)]) + "\n" + text(name)
