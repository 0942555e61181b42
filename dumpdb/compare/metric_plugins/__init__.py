"""Compare metrics added as plug-ins: one module per metric, each calling
:func:`dumpdb.compare.registry.register` at import (see that module's docstring).

Example (``dumpdb/compare/metric_plugins/max_ulp.py``)::

    import numpy as np
    from dumpdb.compare.registry import Metric, register

    def _max_ulp(target, bench):
        ...

    register(Metric("max_ulp", "tensor", "max distance in float32 ULPs", function=_max_ulp))
"""
