#!/usr/bin/env bash
# Mutation testing of dumpdb's core with mutmut 3 (configured in pyproject.toml, [tool.mutmut]).
# Not run by CI: thousands of mutants, slow on 2 cores. mutmut runs, per mutant, only the
# tests that execute the mutated function.
#
#   scripts/mutation.sh                          # the whole core (see CORE below)
#   scripts/mutation.sh 'dumpdb.stats.*'         # only the mutants whose names match these globs
#   scripts/mutation.sh --sample 300 --seed 1 'dumpdb.compare.align.*'
#                                                # a seeded random sample of those mutants
#   scripts/mutation.sh --quick tests/test_store.py 'dumpdb.storage.store.*'
#                                                # the module's own tests first (see below)
#   scripts/mutation.sh --score                  # no run: the score over every mutant run so far
#   scripts/mutation.sh --score 'dumpdb.stats.*' # ... over those globs only
#
# A sample picks N names (without replacement) from the sorted names of the mutants matching
# the globs with Python's random.Random(SEED): the same N, SEED and code give the same mutants.
# Its score is over the sample, with the 95 % (Wilson) interval of the module's score.
# With --sample or --quick, mutants judged already (by an earlier run) keep their result,
# except those named exactly (no wildcard): those are judged again (after adding a test).
#
# --quick TESTS (repeatable): scripts/mutation_prefilter.py runs those test files against
# each mutant first (seconds each) and records the ones they kill; mutmut then judges the
# rest with every test that executes the mutated function (the crash-safety kill schedules
# included: minutes per surviving mutant on 2 shared cores). --quick-arg ARG (repeatable)
# passes ARG to that pytest (e.g. -k EXPR). --quick-only stops after the quick pass and
# records its survivors as survived: the score is then a lower bound.
#
# Last line: "mutation score: P% (K killed / N mutants)". Killed = a test failed (or timed
# out, or the type checker refused it); survived and "no tests" count as not killed;
# mutants never run ("not checked") are left out. Before it, --score prints one line per
# module. Details: mutmut results / mutmut show NAME (run from the repository root).
#
# Environment: VENV (default .venv), MUTMUT_CHILDREN (parallel mutants, default 2),
# DUMPDB_CRASH_POINTS (fraction of the crash tests' kill points, default 0.3).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
MUTMUT="$VENV/bin/mutmut"
PY="$VENV/bin/python"
# The core, as mutant-name globs (module.x_function / module.xǁClassǁmethod).
CORE=(
  'dumpdb.stats.*'
  'dumpdb.layouts.mindspore_kit.x_parse_tensor_name__mutmut_*'
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

SAMPLE=""
SEED=0
SCORE_ONLY=0
QUICK_ONLY=0
QUICK=()
PATTERNS=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --sample) SAMPLE="${2:-}"; shift 2 ;;
    --seed) SEED="${2:-}"; shift 2 ;;
    --quick) QUICK+=(--tests "${2:?--quick takes a test file or directory}"); shift 2 ;;
    --quick-arg) QUICK+=(--pytest-arg="${2:?--quick-arg takes a pytest argument}"); shift 2 ;;
    --quick-only) QUICK_ONLY=1; shift ;;
    --score) SCORE_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 0 ;;
    -*) echo "mutation.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) PATTERNS+=("$1"); shift ;;
  esac
done
if [ -n "$SAMPLE" ] && ! [[ "$SAMPLE" =~ ^[1-9][0-9]*$ ]]; then
  echo "mutation.sh: --sample takes a positive integer, not '$SAMPLE'" >&2; exit 2
fi
if ! [[ "$SEED" =~ ^[0-9]+$ ]]; then
  echo "mutation.sh: --seed takes a non-negative integer, not '$SEED'" >&2; exit 2
fi
if [ "${#PATTERNS[@]}" -eq 0 ]; then PATTERNS=("${CORE[@]}"); fi

# Every generated mutant's name and status ("name: status" lines, mutmut's own result list).
results() { "$MUTMUT" results --all true 2>/dev/null; }
# The selection: "name status" lines of the mutants matching the globs, or of the sample.
SELECT='
import fnmatch, random, sys
n, seed, patterns = int(sys.argv[1] or 0), int(sys.argv[2]), sys.argv[3:]
status = dict(line.strip().rsplit(": ", 1) for line in sys.stdin if ": " in line)
names = sorted(m for m in status if any(fnmatch.fnmatch(m, p) for p in patterns))
if n:
    names = random.Random(seed).sample(names, min(n, len(names)))
    print(f"sample: {len(names)} of the matching mutants (seed {seed})", file=sys.stderr)
exact = {p for p in patterns if not any(c in p for c in "*?[")}
for m in names:
    print(m, "not checked" if m in exact else status[m])
'

if [ "$SCORE_ONLY" -eq 1 ] && [ -n "$SAMPLE" ]; then
  # The score of an earlier sample: the same names (same N, SEED and globs).
  mapfile -t SELECTED < <(results | "$PY" -c "$SELECT" "$SAMPLE" "$SEED" "${PATTERNS[@]}")
  PATTERNS=("${SELECTED[@]%% *}")
fi
if [ "$SCORE_ONLY" -eq 0 ]; then
  RUN=("${PATTERNS[@]}")
  if [ -n "$SAMPLE" ] || [ "${#QUICK[@]}" -gt 0 ]; then
    # Names exist only once mutmut has generated the mutants: generate them (no test runs;
    # unchanged files keep their results).
    "$PY" -c '
from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, setup_source_paths
from mutmut.mutation.trampoline import set_mutant_under_test
set_mutant_under_test("mutant_generation")
copy_src_dir(); copy_also_copy_files(); setup_source_paths()
create_mutants(1)
' >/dev/null
    # The selection (the sample, or every match), then only those not judged yet.
    mapfile -t SELECTED < <(results | "$PY" -c "$SELECT" "$SAMPLE" "$SEED" "${PATTERNS[@]}")
    if [ "${#SELECTED[@]}" -eq 0 ]; then echo "mutation.sh: no mutant matches ${PATTERNS[*]}" >&2; exit 2; fi
    if [ -n "$SAMPLE" ]; then PATTERNS=("${SELECTED[@]%% *}"); fi
    RUN=()
    for line in "${SELECTED[@]}"; do
      case "$line" in *" not checked") RUN+=("${line%% *}") ;; esac
    done
    if [ "${#QUICK[@]}" -gt 0 ] && [ "${#RUN[@]}" -gt 0 ]; then
      if [ "$QUICK_ONLY" -eq 1 ]; then QUICK+=(--record-survivors); fi
      mapfile -t RUN < <("$PY" scripts/mutation_prefilter.py "${QUICK[@]}" "${RUN[@]}")
      if [ "$QUICK_ONLY" -eq 1 ]; then RUN=(); fi
    fi
  fi
  if [ "${#RUN[@]}" -gt 0 ]; then
    "$MUTMUT" run --max-children "${MUTMUT_CHILDREN:-2}" "${RUN[@]}" || true
  fi
fi

# Score over the selected mutants; with --score, one line per module first. A sample's
# line carries the Wilson 95 % interval of the population's score.
results | "$PY" -c '
import collections, fnmatch, math, sys
per_module, sample, patterns = sys.argv[1] == "1", sys.argv[2], sys.argv[3:]
exact = set(patterns)
killed_statuses = ("killed", "timeout", "caught by type check", "segfault")
by_module = collections.defaultdict(lambda: [0, 0])
killed = total = 0
for line in sys.stdin:
    name, sep, status = line.strip().rpartition(": ")
    if not sep or not (name in exact or any(fnmatch.fnmatch(name, p) for p in patterns)):
        continue
    if status in ("not checked", "skipped"):
        continue
    module = name.split(".x_")[0].split(".xǁ")[0]
    total += 1
    k = status in killed_statuses
    killed += k
    by_module[module][0] += k
    by_module[module][1] += 1
if per_module:
    for module, (k, n) in sorted(by_module.items()):
        print(f"  {module}: {100.0 * k / n:.1f}% ({k} killed / {n} mutants)")
score = 100.0 * killed / total if total else 0.0
if sample and total:
    z, p = 1.96, killed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    print(f"sample of {total} mutants: 95% interval {100 * (centre - half):.1f}% to {100 * (centre + half):.1f}%")
print(f"mutation score: {score:.1f}% ({killed} killed / {total} mutants)")
' "$SCORE_ONLY" "$SAMPLE" "${PATTERNS[@]}"
