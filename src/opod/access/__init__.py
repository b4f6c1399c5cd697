"""Who may call: API keys and node tokens, held in memory and read by the gateway and the join paths.

- :mod:`~opod.access.service`: the one writer (store first, then memory).
- :mod:`~opod.access.keytable`: the API keys ``/v1`` and ``/api/v1`` check, by hash.
- :mod:`~opod.access.nodetokens`: the node tokens workers join with.
- :mod:`~opod.store.offloop`: how async code calls the synchronous store.
"""
