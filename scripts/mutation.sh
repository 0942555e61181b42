#!/usr/bin/env bash
# Mutation testing of dumpdb's core with mutmut 3 (configured in pyproject.toml, [tool.mutmut]).
# Not run by CI: thousands of mutants, slow on 2 cores. mutmut runs, per mutant, only the
# tests that execute the mutated function.
#
#   scripts/mutation.sh                 # the whole core (see CORE below)
#   scripts/mutation.sh 'dumpdb.stats.*' # only the mutants whose names match these globs
#
# Last line: "mutation score: P% (K killed / N mutants)". Killed = a test failed (or timed
# out, or the type checker refused it); survived and "no tests" count as not killed.
# Details: .venv/bin/mutmut results / mutmut show NAME (run from the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
MUTMUT="$VENV/bin/mutmut"
PY="$VENV/bin/python"
# The core, as mutant-name globs (module.x_function / module.xǁClassǁmethod).
CORE=(
  'dumpdb.stats.*'
  'dumpdb.layouts.mindspore_sync.x_parse_tensor_name__mutmut_*'
  'dumpdb.layouts.mindspore_legacy.x_parse_bin_name__mutmut_*'
  'dumpdb.layouts.msaccucmp.x_parse_msaccucmp_name__mutmut_*'
  'dumpdb.layouts.tensordump.x_parse_tensordump_name__mutmut_*'
  'dumpdb.layouts.msprobe.x_parse_record_key__mutmut_*'
  'dumpdb.layouts.ascend.*_parse_bin_name__mutmut_*'
  'dumpdb.storage.store.*'
  'dumpdb.storage.shard.*'
  'dumpdb.ingestion.pipeline.*_accept__mutmut_*'
  'dumpdb.ingestion.pipeline.*_durable__mutmut_*'
  'dumpdb.ingestion.pipeline.*_commit__mutmut_*'
  'dumpdb.ingestion.pipeline.*_row__mutmut_*'
  'dumpdb.archival.verify.*'
  'dumpdb.compare.metrics.*'
  'dumpdb.compare.align.*'
)
# Fewer kill points per crash test (each mutant of the ingest commit runs them).
export DUMPDB_CRASH_POINTS="${DUMPDB_CRASH_POINTS:-0.3}"
if [ "$#" -gt 0 ]; then PATTERNS=("$@"); else PATTERNS=("${CORE[@]}"); fi
"$MUTMUT" run --max-children "${MUTMUT_CHILDREN:-2}" "${PATTERNS[@]}" || true
# Score over the selected mutants, from mutmut's own result list ("name: status" lines).
"$MUTMUT" results --all true 2>/dev/null | "$PY" -c '
import fnmatch, sys
patterns = sys.argv[1:]
killed = total = 0
for line in sys.stdin:
    name, sep, status = line.strip().rpartition(": ")
    if not sep or not any(fnmatch.fnmatch(name, p) for p in patterns):
        continue
    if status in ("not checked", "skipped"):
        continue
    total += 1
    killed += status in ("killed", "timeout", "caught by type check", "segfault")
score = 100.0 * killed / total if total else 0.0
print(f"mutation score: {score:.1f}% ({killed} killed / {total} mutants)")
' "${PATTERNS[@]}"
