"""The management API's wire types (``/api/v1`` on the admin listener), one module per area."""
