"""The gcp_tpu provider: its provider class in ``provider``, its settings (pure data) in ``settings``, its
``testbed check`` in ``usable``, and here its registration (pure data).

Nothing else is imported here, so that finding the providers or loading a spec never loads the provider.
"""

from testbed.providers.registration import Extra, Registration

PROVIDER = Registration(__name__, "gcp-tpu", "TpuProvider", "TpuSettings", order=3, costs_money=True,
                        extra=Extra("tpu", ("google.cloud.tpu_v2", "google.auth"), "google-cloud-tpu"))
