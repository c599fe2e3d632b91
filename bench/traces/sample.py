"""Which mini-swe-agent runs `sample_a/`, `sample_b/` and `sample_c/` hold: drawn once, by seed, not chosen.

From the 500 trajectories of `swebench_results/20251118_gemini-3-pro-74pct/trajs` (gruckion/mini-swe-agent at
d12a71a), the five already used (the packaged `mini_django` and the four held-out traces) left out: sample A
is `random.Random(2026).sample(rest, 12)`, sample B `random.Random(2027).sample(what A left, 12)`, sample C
`random.Random(2028).sample(what A and B left, 12)` (drawn on 2026-12-07, after every rule it measures was chosen).
Usage: `python -m bench.traces.sample GIT_DIR` prints the lists (GIT_DIR: a clone or mirror of that repository).
"""

from __future__ import annotations

import random
import subprocess
import sys

TRAJS = "swebench_results/20251118_gemini-3-pro-74pct/trajs"
COMMIT = "d12a71a"
USED = frozenset(
    {
        "django__django-11138",
        "psf__requests-2317",
        "scikit-learn__scikit-learn-14496",
        "sympy__sympy-16766",
        "pydata__xarray-6721",
    }
)


def samples(instances: list[str]) -> tuple[list[str], list[str], list[str]]:
    rest = [i for i in sorted(instances) if i not in USED]
    a = random.Random(2026).sample(rest, 12)
    b = random.Random(2027).sample([i for i in rest if i not in a], 12)
    c = random.Random(2028).sample([i for i in rest if i not in a and i not in b], 12)
    return a, b, c


if __name__ == "__main__":
    listing = subprocess.run(
        ["git", "--git-dir", sys.argv[1], "ls-tree", "-r", "--name-only", COMMIT, TRAJS],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    ids = sorted({path.split("/")[3] for path in listing.split() if path.endswith(".traj.json")})
    for name, chosen in zip("ABC", samples(ids), strict=True):
        print(f"sample {name}: " + " ".join(chosen))
