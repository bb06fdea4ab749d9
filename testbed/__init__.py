"""testbed: provision -> setup -> run -> collect -> report for research artifacts.

From Python (a script, a notebook), the CLI's verbs as methods (docs/api.md)::

    import testbed
    tb = testbed.open("my-lab").provision()
    tb.exec("hostname")                 # raises HostsFailed when a host fails; warn=True returns the results
    run = tb.run_suite("my-suite")      # waits; raises RunFailed when the run does not succeed
    run.report("results")

Everything is imported on first use: ``import testbed`` loads nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["HostsFailed", "Run", "RunFailed", "Testbed", "TestbedError", "UsageError", "open"]

if TYPE_CHECKING:
    from testbed.errors import HostsFailed, RunFailed, TestbedError, UsageError
    from testbed.handle import Run, Testbed
    from testbed.state import Store


def open(name: str, store: Store | None = None) -> Testbed:
    """The testbed ``name`` (``inventories/<name>.yml``, or a spec path) as this state home knows it. A folder
    without state stays without one until a verb records something (``provision``, ``run_suite``...)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.handle import Testbed
    from testbed.state import Store

    return Testbed.open(name, store or Store.open_lazy(), recorded_ok=True)


def __getattr__(name: str) -> Any:
    if name in ("Testbed", "Run"):
        # lazy: start-up (testbed status and exec load this module)
        from testbed import handle

        return getattr(handle, name)
    if name == "__version__":
        # lazy: start-up (testbed status and exec load this module)
        from testbed.distribution import SOURCE_VERSION

        return SOURCE_VERSION
    if name in ("TestbedError", "UsageError", "HostsFailed", "RunFailed"):
        # lazy: start-up (testbed status and exec load this module)
        from testbed import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (``dir(testbed)``, a notebook's completion): the verbs' entry point, the handles and the
    exceptions, loaded on first use; not the helpers this module imports for itself."""
    return sorted([*__all__, "__version__"])
