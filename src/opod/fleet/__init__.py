"""The fleet in memory: workers, what they hold, the liveness rule and the router.

Below both the gateway and the control plane, so both read the same state;
rebuilt from heartbeats, never read from the store on the request path.
"""
