# ruff: noqa: E501  (the table of paths below reads best one run a line)
"""Which runs of other agents `others_a/` (tuning) and `others_b/` (held out) hold, and how they were made.

Every public run found of two agents that read files in numbered windows and quote line numbers later:
SWE-agent (function calling, text mode, and its CTF demonstrations) from `SWE-agent/SWE-agent` (MIT) at
3ea751c, the packaged marshmallow and pydicom runs left out; OpenHands event logs from `All-Hands-AI/OpenHands`
(MIT outside `enterprise/`), read from the copy vendored in `anonymousUser2026/ContextBench` at cd5f62e
(`Context-Bench/agent-frameworks/openhands/poly-pro/`). Split by kind, by seed, not chosen: within each kind
the sorted list is shuffled by `random.Random(27)` and its first half (rounded up) goes to A.
Usage: `python -m bench.traces.others SWE_AGENT_GIT_DIR CONTEXTBENCH_GIT_DIR` writes both folders.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from bench.traces.convert import convert_openhands, convert_sweagent

HERE = Path(__file__).resolve().parent
SWE_AGENT = ("SWE-agent/SWE-agent", "3ea751c")
CONTEXTBENCH = ("anonymousUser2026/ContextBench", "cd5f62e")
OPENHANDS = "Context-Bench/agent-frameworks/openhands/poly-pro/tests"
DEMOS = "trajectories/demonstrations"
TESTS = "tests/test_data/trajectories"

# kind -> (name, repo, path, record): record is the line of a .jsonl file, or -1 for a whole file.
RUNS: dict[str, list[tuple[str, tuple[str, str], str, int]]] = {
    "swe-agent function calling": [
        ("fc_marshmallow-1867", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__function_calling__install-1/marshmallow-code__marshmallow-1867.traj", -1),
        ("fc_replace_marshmallow-1867", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__function_calling_replace__install-1/marshmallow-code__marshmallow-1867.traj", -1),
        ("fc_simple", SWE_AGENT, f"{DEMOS}/function_calling_simple.traj", -1),
        ("fc_test-repo-1c2844", SWE_AGENT, f"{TESTS}/gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/6e44b9__sweagenttestrepo-1c2844.traj", -1),
    ],
    "swe-agent text": [
        ("text_marshmallow-1867_default", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__default__t-0.20__p-0.95__c-2.00__install-1___install_from_source/marshmallow-code__marshmallow-1867.traj", -1),
        ("text_marshmallow-1867_cursors", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__default_sys-env_cursors_window100__t-0.20__p-0.95__c-2.00__install-1/marshmallow-code__marshmallow-1867.traj", -1),
        ("text_marshmallow-1867_window100", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__default_sys-env_window100__t-0.20__p-0.95__c-2.00__install-1/marshmallow-code__marshmallow-1867.traj", -1),
        ("text_marshmallow-1867_xml_cursors", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__xml_sys-env_cursors_window100__t-0.20__p-0.95__c-2.00__install-1/marshmallow-code__marshmallow-1867.traj", -1),
        ("text_marshmallow-1867_xml_window100", SWE_AGENT, f"{DEMOS}/replay__marshmallow-code__marshmallow-1867__xml_sys-env_window100__t-0.20__p-0.95__c-2.00__install-1/marshmallow-code__marshmallow-1867.traj", -1),
        ("text_test-repo-i1", SWE_AGENT, f"{TESTS}/gpt4__swe-agent__test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/swe-agent__test-repo-i1.traj", -1),
        ("text_humanevalfix-0", SWE_AGENT, f"{DEMOS}/human_thought__swe-bench-HumanEvalFix-python__lcb__t-0.00__p-0.95__c-4.00__install-0/humanevalfix-python-0.traj", -1),
    ],
    "swe-agent ctf": [
        (f"ctf_{name.split('/')[-1]}", SWE_AGENT, f"{DEMOS}/ctf/{name}.traj", -1)
        for name in (
            "crypto/BabyEncryption", "crypto/BabyTimeCapsule", "crypto/eps", "crypto/katy", "forensics/flash",
            "misc/networking_1", "pwn/warmup", "rev/rock", "web/i_got_id_demo",
        )
    ],
    "openhands": [
        ("openhands_resolver-pr-viewer-1", CONTEXTBENCH, f"{OPENHANDS}/unit/resolver/mock_output/output.jsonl", 1),
        ("openhands_resolver-pr-viewer-5", CONTEXTBENCH, f"{OPENHANDS}/unit/resolver/mock_output/output.jsonl", 0),
        ("openhands_basic", CONTEXTBENCH, f"{OPENHANDS}/runtime/trajs/basic.json", -1),
        ("openhands_basic_gui_mode", CONTEXTBENCH, f"{OPENHANDS}/runtime/trajs/basic_gui_mode.json", -1),
    ],
}  # fmt: skip


def split() -> tuple[list[str], list[str]]:
    a: list[str] = []
    b: list[str] = []
    for runs in RUNS.values():
        names = sorted(name for name, *_ in runs)
        random.Random(27).shuffle(names)
        half = (len(names) + 1) // 2
        a += names[:half]
        b += names[half:]
    return a, b


def _show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def main(swe_agent_git: str, contextbench_git: str) -> None:
    dirs = {SWE_AGENT: swe_agent_git, CONTEXTBENCH: contextbench_git}
    a, _b = split()
    for kind, runs in RUNS.items():
        for name, (repo, commit), path, record in runs:
            text = _show(dirs[(repo, commit)], commit, path)
            source = f"{repo}@{commit}:{path}" + (f" (line {record + 1})" if record >= 0 else "")
            if kind == "openhands":
                doc = json.loads(text.splitlines()[record]) if record >= 0 else json.loads(text)
                trace = convert_openhands(doc["history"] if isinstance(doc, dict) else doc, source)
            else:
                trace = convert_sweagent(json.loads(text), source)
            folder = HERE / ("others_a" if name in a else "others_b")
            folder.mkdir(exist_ok=True)
            (folder / f"{name}.json").write_text(json.dumps(trace, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
