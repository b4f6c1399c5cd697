"""Who may call: API keys and node tokens, people, their places in the tenancy tree, and the sign-in secrets.

- :mod:`~opod.access.service`: the one writer of keys and node tokens (store first, then memory).
- :mod:`~opod.access.keytable`: the API keys ``/v1`` and ``/api/v1`` check, by hash.
- :mod:`~opod.access.nodetokens`: the node tokens workers join with.
- :mod:`~opod.access.keys`: the rules of a key the management API issues (owner, band, profile, lifetime).
- :mod:`~opod.access.tenancy`, :mod:`~opod.access.people`: the tree and the people, each its one writer.
- :mod:`~opod.access.members`: the rules of putting people in places and taking them out (the keys they lose).
- :mod:`~opod.access.secrets`: the sign-in secrets and SCIM's bearer token.
- :mod:`~opod.access.scopes`: the one reader of scope texts.
"""
