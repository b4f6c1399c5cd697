"""The management API ``/api/v1`` on the admin listener: keys, node tokens, models, nodes."""
