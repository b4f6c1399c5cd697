"""The worker: its identity and inventory, register and heartbeat, its listener, and the engine processes it supervises."""
