"""Checks over one run: first NaN/Inf, fp16 overflow, all-zero, MindInsight watch conditions.

``registry`` (the :class:`~dumpdb.checks.registry.Check` entry type and ``CHECKS``),
``conditions`` (one entry per check), ``scan`` (the engine: statistics in SQL first,
payloads only where needed).
"""
