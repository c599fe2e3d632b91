#!/usr/bin/env bash
# The guard against the hot path drifting back (issue 30): before merging a change that touches the request
# path, the proxy of this working tree against BASE's in one run (`python -m bench ab`, CPU per request at
# concurrency 16, json then stream). Prints the line to put in the commit message. Exits 1 when either mode's
# CPU new/old is above AB_LIMIT (default 1.10: on a shared 2-core machine one run's noise is about ±5%, so
# run it again before believing a failure), 0 at once when nothing on the request path changed.
# Usage: scripts/ab_guard.sh [BASE, default main] [requests a block, default 400]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${1:-main}"
N="${2:-400}"
LIMIT="${AB_LIMIT:-1.10}"
# What a request runs through: the shell, the engine and its service, the dialects, token counting, the
# session stores and the metrics it updates. Config, the demo, the CLI and the wrappers run once or never.
REQUEST_PATH=(proxy/shell proxy/service proxy/context proxy/dialects proxy/tokens proxy/state proxy/metrics.py proxy/errors.py)
changed="$(git diff --name-only "$BASE" -- "${REQUEST_PATH[@]}")"
if [ -z "$changed" ]; then
  echo "ab_guard: nothing on the request path differs from $BASE"
  exit 0
fi
echo "ab_guard: the request path differs from $BASE in:" >&2
printf '  %s\n' $changed >&2
result="$(mktemp)"
trap 'rm -f "$result"' EXIT
python -m bench ab --ref "$BASE" -n "$N" --json "$result" >&2
python - "$result" "$BASE" "$LIMIT" <<'PY'
import json, sys

result, base, limit = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3])
ratios = {mode: row["cpu_new_over_old"] for mode, row in result["modes"].items()}
print(f"bench ab --ref {base}: CPU new/old " + ", ".join(f"{mode} {ratio:.3f}" for mode, ratio in ratios.items()))
worse = [mode for mode, ratio in ratios.items() if ratio > limit]
if worse:
    print(f"ab_guard: CPU per request above {limit}x {base}'s in {', '.join(worse)}", file=sys.stderr)
    sys.exit(1)
PY
