"""The chameleon provider: its provider class in ``provider``, its settings (pure data) in ``settings``, its
``testbed check`` in ``usable``, and here its registration (pure data).

Nothing else is imported here, so that finding the providers or loading a spec never loads the provider.
"""

from testbed.providers.registration import Extra, Registration

PROVIDER = Registration(__name__, "chameleon", "ChameleonProvider", "ChameleonSettings", order=2, costs_money=True,
                        extra=Extra("chameleon", ("chi", "blazarclient", "openstack"), "python-chi"))
