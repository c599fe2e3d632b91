"""Where the window forces an epoch, a cleared output keeps a stub of the lines the agent quoted; where an epoch only
pays, it clears to the placeholder (`policy.clear_tool_outputs.forced_stub_tokens`).

An agent, driven through the real proxy by the official SDK, reads a numbered view of a file and quotes one of its
lines, then reads a second view whose lines it had named before reading it, then keeps running a command with a long
output. Behind a 32k window that reads its cache at a tenth of the price, no clearing pays before the window forces
one; behind a 128k window with no cache discount, every clearing pays long before the window is near.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.clearing import CLEARED_SUFFIX, PLACEHOLDER
from proxy.demo.simulator import SIMULATOR, start_simulator
from proxy.service.engine_service import build_context_service
from proxy.shell.server import start
from tests.harness import scripted_agent
from tests.pairing import check_pairing

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = """
[upstream]
base_url = "{url}"

[models."sim-32k"]
context_window = 32000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = 0.1

[models."gpt-4o"]
context_window = 128000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = 1.0

[policy]
reserve_output_tokens = 4096
"""

IO_VIEW = "[File: /repo/src/io_utils.py (400 lines total)]\n" + "\n".join(
    f"{n}:    " + ("def read_header_v2(raw):" if n == 88 else f"value_{n} = compute_{n}(raw)") for n in range(40, 140)
)
PARSER_VIEW = "[File: /repo/src/parser.py (300 lines total)]\n" + "\n".join(
    f"{n}:  " + ("def parse_block_v3(chunk):" if n == 212 else f"token_{n} = scan_{n}(chunk)") for n in range(180, 280)
)
STEPS = {
    1: "Next I open src/parser.py at line 212, where parse_block_v3 reads token_211 = scan_211(chunk) and token_213.",
    2: "Reading src/io_utils.py.",
    3: "Line 88 of src/io_utils.py defines read_header_v2, after value_87 = compute_87(raw): I will edit it.",
}
OUTPUTS = {2: IO_VIEW, 4: PARSER_VIEW}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, Any]]:
    sim_runner, sim_url = await start_simulator()
    folder = tmp_path_factory.mktemp("forced-stubs")
    (folder / "proxy.toml").write_text(CONFIG.format(url=sim_url))
    holder = ConfigHolder(load_settings(folder / "proxy.toml"))
    runner, port = await start(holder, "127.0.0.1", 0, context=build_context_service(holder))
    yield f"http://127.0.0.1:{port}", sim_runner.app[SIMULATOR]
    await runner.cleanup()
    await sim_runner.cleanup()


async def agent(root: str, sim: Any, session: str, model: str, steps: int) -> list[list[dict[str, Any]]]:
    """The agent's run through the proxy: what went upstream each turn."""

    def step(k: int) -> tuple[str, str, str]:
        return STEPS.get(k, f"Step {k}."), "{}", OUTPUTS.get(k, f"run {k} " + "x " * 2000)

    _, upstream = await scripted_agent(f"{root}/s/{session}/v1", sim, steps, step, model)
    return upstream


async def epochs(root: str, session: str) -> list[tuple[int, list[str]]]:
    """The session's epochs: the turn and its reasons (`/sessions/{id}`)."""
    async with aiohttp.ClientSession() as http, http.get(f"{root}/sessions/{session}") as response:
        details = (await response.json())["turn_details"]
    return [(t["turn"], t["reasons"]) for t in details if t["epoch"]]


def output(request: list[dict[str, Any]], call_id: str) -> str:
    """The content `call_id`'s output went up with ("" before the agent ran it)."""
    return next((m["content"] for m in request if m.get("tool_call_id") == call_id), "")


def first_cleared(upstream: list[list[dict[str, Any]]], call_id: str) -> int:
    """The turn (1-based, as `/sessions` counts) on which `call_id`'s output first went up cleared."""
    return next(k + 1 for k, request in enumerate(upstream) if output(request, call_id).endswith(CLEARED_SUFFIX))


async def test_an_output_the_window_forces_out_keeps_the_lines_the_agent_quoted(proxy: tuple[str, Any]) -> None:
    root, sim = proxy
    upstream = await agent(root, sim, "forced", "sim-32k", 16)

    turn = first_cleared(upstream, "c2")
    assert dict(await epochs(root, "forced"))[turn][0] == "window"  # the window forced the clearing
    stub = output(upstream[-1], "c2").split("\n")
    assert stub[0] == "[File: /repo/src/io_utils.py (400 lines total)]"
    assert "88:    def read_header_v2(raw):" in stub and "87:    value_87 = compute_87(raw)" in stub
    assert len(stub) < 30 and stub[-1].endswith(CLEARED_SUFFIX)
    # The view whose lines the agent named before reading it keeps them too: the window drops old agent messages.
    assert "212:  def parse_block_v3(chunk):" in output(upstream[-1], "c4").split("\n")
    assert output(upstream[-1], "c5") == PLACEHOLDER  # what it never quoted goes whole
    for k in range(turn, len(upstream)):  # made once, then sent byte for byte
        assert output(upstream[k], "c2") == output(upstream[-1], "c2"), f"turn {k + 1}"
        assert check_pairing(upstream[k]) == []


async def test_an_epoch_that_only_pays_clears_even_a_quoted_output_to_the_placeholder(proxy: tuple[str, Any]) -> None:
    root, sim = proxy
    upstream = await agent(root, sim, "voluntary", "gpt-4o", 16)

    turn = first_cleared(upstream, "c2")
    assert dict(await epochs(root, "voluntary"))[turn] == ["clearing"]
    assert output(upstream[-1], "c2") == output(upstream[-1], "c4") == PLACEHOLDER
