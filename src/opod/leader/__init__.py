"""The leader: the composition root of ``opod up``: fleet state, node registry, listeners, lifecycle."""
