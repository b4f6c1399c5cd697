"""opod.settings: the cluster's versioned settings (prices, budgets, retention, webhooks, Prometheus, key rules, auth).

The settings are one YAML body kept as numbered versions in the store; ``schema`` says what the body
may hold, ``text`` reads and validates it (errors name the line and the field), and ``holder`` keeps
the version in force on a leader, polling the store so every leader follows a change within 2 s.
"""
