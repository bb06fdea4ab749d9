"""testbed: provision -> setup -> run -> collect -> report for research artifacts."""

__version__ = "0.1.0"
