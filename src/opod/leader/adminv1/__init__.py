"""``/admin/v1``: the manager contract's routes on the public listener, behind the admin key.

The frozen route list (``opod.contract.features.frozen_routes``) is held by a
test that walks this app, so a route cannot silently disappear. Errors use the
leader's shape, ``{"error": {"message", "type"}}``.
"""
