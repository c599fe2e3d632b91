"""Turn a mini-swe-agent trajectory (`*.traj.json`) into a trace: `{"source", "format", "tools", "messages"}`.

As for the packaged `mini_django` trace: each assistant message's one bash block becomes a `bash` tool call
(`call_NNNN`, NNNN its index), the observation after it its `tool` result; a message without exactly one
block (a format error) stays text, and so does the user's answer to it. Usage:
`python -m bench.traces.convert TRAJ.json SOURCE > bench/traces/NAME.json`.
"""

from __future__ import annotations

import json
import re
import sys
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


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(convert(json.load(f), sys.argv[2]), indent=1))
