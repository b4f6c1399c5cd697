"""The operator console: server-rendered pages on the admin listener, beside the areas of ``/api/v1`` they show."""
