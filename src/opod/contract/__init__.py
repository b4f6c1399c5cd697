"""The opod wire contract: types and helpers only, shared by leader, workers and managers.

Depends on pydantic and the standard library. Nothing here decides anything.

- :mod:`~opod.contract.adminapi`: ``/admin/v1``, ``/loadz``, the streams, the auth and policy files
- :mod:`~opod.contract.nodeapi`: the node protocol between workers and the leader
- :mod:`~opod.contract.catalog`: the catalog entry schema
- :mod:`~opod.contract.env`: the environment contract
- :mod:`~opod.contract.features`: feature keys and the frozen route list
- :mod:`~opod.contract.nodeauth`: the ``X-Opod-Auth`` HMAC signature
- :mod:`~opod.contract.blockhash`: prefix-cache block hashes
- :mod:`~opod.contract.wire` and :mod:`~opod.contract.gojson`: Go's JSON rules
"""

from opod.contract.adminapi import CONTRACT_VERSION
from opod.contract.blockhash import block_hash, block_hashes
from opod.contract.nodeapi import decode_hardware, encode_hardware
from opod.contract.wire import WireError, WireModel

__all__ = [
    "CONTRACT_VERSION",
    "WireError",
    "WireModel",
    "block_hash",
    "block_hashes",
    "decode_hardware",
    "encode_hardware",
]
