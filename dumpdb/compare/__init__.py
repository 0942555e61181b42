"""Run-to-run comparison and first divergence.

Modules (one concern each):

``metrics``   per-pair tensor metrics (msprobe + msaccucmp definitions, reference
              formats.md 2.1/2.2), computed in chunks with float64 accumulation, and
              statistics-mode differences;
``verdict``   msprobe's pass/warning/error rules over the rows of one op;
``align``     pairing target and bench tensors: exact key, normalised name,
              execution-order position within op type, user mapping file;
``engine``    selection, alignment, streaming tensor reads, metrics on all cores,
              results stored in ``compare_results``.

Scans of one run live in :mod:`dumpdb.checks`; CSV/Parquet/HTML output in
:mod:`dumpdb.render`.
"""
