"""Engine drivers: how opod starts each inference engine, tells when it is ready, and reads its load.

Look a driver up with :func:`opod.engines.registry.get_driver`; the interface is
:class:`opod.engines.base.EngineDriver`.
"""
