"""The named choices of a comparison, in a module with no imports.

The engine and the aligner check their arguments against these, and the CLI lists
them in ``--help`` and refuses other values as usage errors without importing the
engine (numpy, pyarrow: start-up time of every ``dumpdb`` call).
"""

MODES = ("auto", "tensor", "statistics")  # compare(mode=...): auto reads payloads where stored
RULES = ("precision", "msprobe")  # compare(rules=...): verdicts of the summary and the first divergence
STRATEGIES = ("exact", "normalized", "sequence", "order", "mapping")  # align(strategies=...), in order
