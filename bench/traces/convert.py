"""Turn an agent's recorded run into a trace: `{"source", "format", "tools", "messages"}`.

Three kinds of run, each kept in the form its agent sent it:
- mini-swe-agent (`*.traj.json`), as for the packaged `mini_django` trace: each assistant message's one bash
  block becomes a `bash` tool call (`call_NNNN`, NNNN its index), the observation after it its `tool` result; a
  message without exactly one block (a format error) stays text, and so does the user's answer to it.
- SWE-agent (`*.traj`): its `history` as sent, function calling (`tool_calls`, `role: tool`) or text mode
  (observations are user messages); `tools` is the schema of the functions the run called (names and the
  argument keys it used, all strings: the trajectory does not keep the schema it was sent).
- OpenHands (one event list, or one `output.jsonl` record's `history`): each agent action (`run`,
  `run_ipython`, `edit`, `read`, `finish`) becomes a tool call of CodeAct's tool for it, the observation
  caused by it its `tool` result, agent messages stay text, user messages stay user messages.
Usage: `python -m bench.traces.convert [--format mini|swe-agent|openhands] [--record N] FILE SOURCE`.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from typing import Any

BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command and return its output.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


def convert(trajectory: dict[str, Any], source: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    pending: str | None = None
    for i, m in enumerate(trajectory["messages"]):
        role, content = m["role"], m["content"]
        if role == "assistant":
            blocks = BLOCK.findall(content)
            if len(blocks) == 1:
                pending = f"call_{i:04d}"
                text = BLOCK.sub("", content).strip()
                call = {"id": pending, "type": "function", "function": {"name": "bash", "arguments": ""}}
                call["function"]["arguments"] = json.dumps({"command": blocks[0]})
                messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
                continue
            pending = None
            messages.append({"role": "assistant", "content": content})
        elif role == "user" and pending is not None:
            messages.append({"role": "tool", "tool_call_id": pending, "content": content})
            pending = None
        else:
            messages.append({"role": role, "content": content})
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()  # the submission's output: no answer follows it
    return {"source": source, "format": "mini-swe-agent", "tools": TOOLS, "messages": messages}


def convert_sweagent(trajectory: dict[str, Any], source: str) -> dict[str, Any]:
    """A SWE-agent `.traj`'s `history`: roles and contents as sent; `tool_calls` parsed from the repr it keeps."""
    messages: list[dict[str, Any]] = []
    for m in trajectory["history"]:
        role, content = m["role"], m.get("content") or ""
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            calls = ast.literal_eval(calls) if isinstance(calls, str) else calls
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        elif role == "tool":
            ids = m.get("tool_call_ids") or []
            ids = ast.literal_eval(ids) if isinstance(ids, str) else ids
            messages.append({"role": "tool", "tool_call_id": ids[0], "content": content})
        else:
            messages.append({"role": role, "content": content})
    _drop_unanswered(messages)
    return {"source": source, "format": "swe-agent", "tools": _called_tools(messages), "messages": messages}


OPENHANDS_TOOLS = {  # CodeAct's tool for each action, and the argument it carries
    "run": ("execute_bash", ("command",)),
    "run_ipython": ("execute_ipython_cell", ("code",)),
    "edit": ("str_replace_editor", ("command", "path", "old_str", "new_str", "file_text", "content")),
    "read": ("str_replace_editor", ("command", "path", "view_range")),
    "finish": ("finish", ("outputs",)),
}


def convert_openhands(events: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """An OpenHands event log: actions as tool calls (args from the event), their observations as results."""
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for k, e in enumerate(events):
        args = e.get("args") or {k2: v for k2, v in e.items() if k2 not in ("action", "observation", "source")}
        if "action" in e:
            action = e["action"]
            if action == "message":
                role = "assistant" if e.get("source") == "agent" else "user"
                messages.append({"role": role, "content": args.get("content", "")})
            elif action in OPENHANDS_TOOLS:
                name, keys = OPENHANDS_TOOLS[action]
                call_args = {key: args[key] for key in keys if args.get(key) not in (None, "")}
                call_id = f"call_{k:04d}"
                call = {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(call_args)},
                }
                messages.append({"role": "assistant", "content": args.get("thought", ""), "tool_calls": [call]})
                pending.append(call_id)
        elif e.get("observation") in OPENHANDS_TOOLS and pending:
            messages.append({"role": "tool", "tool_call_id": pending.pop(0), "content": str(e.get("content", ""))})
    _drop_unanswered(messages)
    return {"source": source, "format": "openhands", "tools": _called_tools(messages), "messages": messages}


def _drop_unanswered(messages: list[dict[str, Any]]) -> None:
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()  # the last output: no answer follows it


def _called_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The functions a run called, each with the argument keys it used (as strings): what the trace can tell."""
    keys: dict[str, set[str]] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
            except ValueError:
                args = {}
            keys.setdefault(call["function"]["name"], set()).update(args if isinstance(args, dict) else ())
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "",
                "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in sorted(ks)}},
            },
        }
        for name, ks in keys.items()
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.traces.convert")
    parser.add_argument("--format", choices=("mini", "swe-agent", "openhands"), default="mini")
    parser.add_argument("--record", type=int, default=0, help="which line of a .jsonl file (OpenHands output)")
    parser.add_argument("file")
    parser.add_argument("source")
    ns = parser.parse_args(argv)
    with open(ns.file) as f:
        doc = [json.loads(line) for line in f][ns.record] if ns.file.endswith(".jsonl") else json.load(f)
    if ns.format == "openhands":
        trace = convert_openhands(doc["history"] if isinstance(doc, dict) else doc, ns.source)
    elif ns.format == "swe-agent":
        trace = convert_sweagent(doc, ns.source)
    else:
        trace = convert(doc, ns.source)
    print(json.dumps(trace, indent=1))


if __name__ == "__main__":
    main()
