"""The lab provider: its provider class in ``provider``, its settings (pure data) in ``settings``.

Nothing is imported here, so that loading a spec (which imports ``settings``) never loads the provider.
"""
