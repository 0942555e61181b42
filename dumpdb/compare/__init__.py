"""Run-to-run comparison, first divergence, NaN/Inf scans and watch conditions.

Modules (one concern each):

``metrics``   per-pair tensor metrics (msprobe + msaccucmp definitions, reference
              formats.md 2.1/2.2), computed in chunks with float64 accumulation, and
              statistics-mode differences;
``verdict``   msprobe's pass/warning/error rules over the rows of one op;
``align``     pairing target and bench tensors: exact key, normalised name,
              execution-order position within op type, user mapping file;
``engine``    selection, alignment, streaming tensor reads, metrics on all cores,
              results stored in ``compare_results``;
``scan``      first NaN/Inf, fp16 overflow, all-zero, MindInsight watch conditions;
``report``    self-contained HTML reports.
"""
