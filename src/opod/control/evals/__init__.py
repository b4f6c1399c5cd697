"""Evaluations: quality suites, runs of them through ``/v1``, paired comparisons and each model's eval gate.

The service (:mod:`opod.control.evals.service`) is the one writer of runs; the route module
``opod.control.evaluations`` is a thin layer over it.
"""
