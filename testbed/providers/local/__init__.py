"""The local provider: its provider class in ``provider``, its settings (pure data) in ``settings``, its
``testbed check`` in ``usable``, and here its registration (pure data).

Nothing else is imported here, so that finding the providers or loading a spec never loads the provider.
"""

from testbed.providers.registration import Registration

PROVIDER = Registration(__name__, "local", "LocalProvider", "LocalSettings", order=0)
