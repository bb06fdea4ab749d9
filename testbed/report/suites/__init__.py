"""Built-in suite reporters; importing this package registers them."""

from testbed.report.suites import (  # noqa: F401
    datastall,
    fault_drill,
    isca,
    jitc,
    matmul_baseline,
    mpi_hello,
    neuronabox,
    tesla,
)
