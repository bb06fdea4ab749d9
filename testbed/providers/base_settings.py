"""What every provider's settings share: the strict base model, the ``Settings`` every kind answers, and the
patterns of values that reach ssh_config and inventories.

Pure data (pydantic and the standard library): loading a spec imports this, never a provider or its cloud SDK.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

HOSTNAME_RE = r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$"
USER_RE = r"^[a-z_][a-z0-9_.-]{0,31}$"
# values written into ssh_config and inventories: no whitespace or control characters (a newline in an address
# would add an ssh_config directive such as ProxyCommand, run on this machine)
ADDRESS_RE = r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[?[0-9A-Fa-f:.]+\]?)$"
JUMP_RE = r"^[A-Za-z0-9_.@:\[\],-]{1,512}$"
PATH_RE = r"^[^\x00-\x1f\x7f\"]{1,4096}$"


def ssh_value(v: str | None, pattern: str, what: str) -> str | None:
    """A value that goes into ssh_config and inventories: refused unless it is plainly ``what``."""
    if v is not None and not re.fullmatch(pattern, v):
        bad = "a line break or control character" if re.search(r"[\x00-\x1f\x7f]", v) else "characters"
        raise ValueError(f"must be {what} ({bad} not allowed: it is written into ssh_config, where a new line "
                         "would add a directive such as ProxyCommand)")
    return v


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, allow_inf_nan=False)


class Settings(Strict):
    """What every provider's settings answer."""

    kind: str
    default_user: ClassVar[str] = "root"  # the spec's login user when it names none

    def refuse_user(self, user: str) -> str | None:
        """Why ``user`` cannot log in on this provider's hosts (None: it can)."""
        return None

    def planned_hosts(self) -> list[str] | None:
        """Host names known from the spec alone; None when the cloud decides."""
        return None

    def planned_addresses(self) -> dict[str, str]:
        """Host addresses known from the spec alone (name -> address)."""
        return {}

    def planned_subnet(self) -> str | None:
        """The hosts' subnet when the spec sets it."""
        return None
