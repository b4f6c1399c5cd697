"""The files a manager mounts, applied live: the auth file, the policy file and the plan file.

:mod:`opod.snapshots.watch` polls one path and applies each new version whole
or not at all; :mod:`~opod.snapshots.auth`, :mod:`~opod.snapshots.policy` and
:mod:`~opod.snapshots.plan` say how each kind is parsed, checked and made
current; :mod:`~opod.snapshots.service` wires the three for a leader.
"""
