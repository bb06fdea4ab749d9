"""Built-in suite reporters (per run and per campaign); importing this package registers them."""

from testbed.report.suites import (  # noqa: F401
    datastall,
    datastall_campaign,
    fault_drill,
    isca,
    isca_campaign,
    jitc,
    matmul_baseline,
    mpi_hello,
    neuronabox,
    tesla,
    tesla_campaign,
)
