"""The dashboard as a user sees it: `context-proxy serve` (a child process) in front of the simulator, real turns
through the `openai` and `anthropic` SDKs, and the page opened in a real headless Chromium (tests/chromium.py).

What the page shows is read from its DOM: each figure carries the number it was written from, so the tests
check both that number against `/stats` and `/sessions/{id}` (fetched with the admin token) and the text
shown for it. Every figure on the page is the proxy's; the page computes none.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio

from proxy.demo.simulator import SimulatorConfig, start_simulator
from proxy.demo.traces import load_trace, requests
from proxy.demo.traces_messages import messages_requests
from proxy.stats_command import usd
from tests.chromium import Browser, Tab, chromium
from tests.served import ServedProxy, serve
from tests.test_stats import CONFIG as STATS_CONFIG

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "tok-dashboard-7f3a9c"
TOKEN_ENV = "DASHBOARD_TEST_ADMIN_TOKEN"
CHAT_MODEL, CLAUDE_MODEL = "sim-8k", "sim-claude-32k"
HOSTILE_ID = "<img/src=x/onerror=window.__pwned=1>"  # printable ASCII without spaces: a valid session id
HOSTILE_MODEL = "sim-<svg/onload=window.__pwned=2>"
# test_stats' proxy (the admin token, the sim-* models), with a Messages upstream and a Claude model beside.
CONFIG = (
    STATS_CONFIG
    + """
[anthropic]
base_url = "{anthropic}"

[models."sim-claude*"]
context_window = 32000
encoding = "o200k_base"
input_per_mtok = 3.00
cached_input_per_mtok = 0.30
"""
)
# Each figure the page shows in `selector`: its field -> [the number it carries, the text shown].
FIGURES = """((selector) => Object.fromEntries([...document.querySelectorAll(selector + ' [data-field]')]
    .map((n) => [n.dataset.field, [JSON.parse(n.dataset.value ?? 'null'), n.textContent]])))"""
ROWS = """[...document.querySelectorAll('#sessions tbody tr[data-key]')].map((tr) => [tr.dataset.key,
    Object.fromEntries([...tr.querySelectorAll('[data-field]')]
        .map((n) => [n.dataset.field, [JSON.parse(n.dataset.value ?? 'null'), n.textContent]]))])"""
TURNS = """[...document.querySelectorAll('#turns tbody tr')].map((tr) => Object.fromEntries(
    [...tr.querySelectorAll('[data-field]')].map((n) => [n.dataset.field, JSON.parse(n.dataset.value)])))"""
POINTS = """((chart, series) => [...document.querySelectorAll(`#${chart} circle[data-series="${series}"]`)]
    .map((c) => JSON.parse(c.dataset.value)))"""


@dataclass
class Rig:
    proxy: ServedProxy
    browser: Browser

    async def get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as client, client.get(self.proxy.root + path, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def signed_in_tab(self) -> Tab:
        """A tab of its own (its own cookies) that opened the dashboard with the token once."""
        tab = await self.browser.new_tab()
        await tab.goto(f"{self.proxy.root}/dashboard?token={TOKEN}")
        await tab.wait_for("Number(document.body.dataset.refreshes) >= 1")
        return tab

    async def key_of(self, session_id: str) -> str:
        return next(row["key"] for row in await self.get("/sessions") if row["id"] == session_id)


TRACE = "sweagent_marshmallow-1867.json"


async def replay(root: str, session: str, turns: range) -> None:
    """The trace's requests numbered `turns` (from 0) through the `openai` SDK, streamed, as session `session`."""
    trace = load_trace(TRACE)
    assert turns.stop <= trace.turns
    extra = {"tools": trace.tools} if trace.tools else {}
    async with openai.AsyncOpenAI(base_url=f"{root}/s/{session}/v1", api_key="sk-dash", max_retries=0) as sdk:
        for k, (messages, _answer) in enumerate(requests(trace)):
            if k in turns:
                stream = await sdk.chat.completions.create(model=CHAT_MODEL, messages=messages, stream=True, **extra)
                assert [chunk async for chunk in stream]


async def chat_turn(root: str, messages: list[dict[str, Any]], *, model: str = CHAT_MODEL, **headers: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{root}/v1", api_key="sk-dash", max_retries=0, default_headers=headers
    ) as sdk:
        await sdk.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]


async def claude_turns(root: str, session: str, turns: int) -> None:
    trace = load_trace(TRACE)
    async with anthropic.AsyncAnthropic(base_url=f"{root}/s/{session}", api_key="sk-ant-dash", max_retries=0) as sdk:
        for k, body in enumerate(messages_requests(trace, CLAUDE_MODEL)):
            if k == turns:
                break
            async with sdk.messages.stream(**body) as stream:
                await stream.get_final_message()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    sim, url = await start_simulator(SimulatorConfig(models={CHAT_MODEL: 8000, CLAUDE_MODEL: 32000}))
    folder: Path = tmp_path_factory.mktemp("dashboard")
    config = folder / "proxy.toml"
    config.write_text(CONFIG.format(token_env=TOKEN_ENV, upstream=url, anthropic=url.removesuffix("/v1")))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(TOKEN_ENV, TOKEN)
        proxy = serve(config, upstream_url=url)
    try:
        await replay(proxy.root, "dash-chat", range(12))  # the trace's 13th turn is left for a test
        await claude_turns(proxy.root, "dash-claude", 4)
        hello = [{"role": "user", "content": "hi"}]
        await chat_turn(proxy.root, hello, model=HOSTILE_MODEL, **{"X-Session-Id": HOSTILE_ID})
        async with chromium() as browser:
            yield Rig(proxy, browser)
    finally:
        log = proxy.stop()
        await sim.cleanup()
    assert TOKEN not in log  # the token reached the proxy in URLs, cookies and headers; no line holds it


def money(field: str) -> bool:
    return field.endswith("_usd")


def shown(field: str, value: Any) -> str:
    """The text the page writes for a figure, as `context-proxy stats` would write it."""
    if value is None:
        return "–"
    if money(field):
        return usd(value)
    if field == "cache_hit_rate":
        return f"{value:.1%}"
    return f"{value:,}"


async def test_the_page_needs_the_admin_token_and_keeps_it_out_of_the_address(rig: Rig) -> None:
    tab = await rig.browser.new_tab()
    await tab.goto(f"{rig.proxy.root}/dashboard")
    assert "needs the proxy's admin token" in await tab.evaluate("document.body.textContent")
    assert await tab.evaluate("fetch('/stats').then((r) => r.status)") == 401

    await tab.goto(f"{rig.proxy.root}/dashboard?token=not-the-token")
    assert "not the proxy's admin token" in await tab.evaluate("document.body.textContent")
    assert await tab.evaluate("fetch('/sessions').then((r) => r.status)") == 401

    await tab.goto(f"{rig.proxy.root}/?token={TOKEN}")  # `/` sends the browser to the dashboard
    assert await tab.evaluate("location.href") == f"{rig.proxy.root}/dashboard"  # the token is not in the URL
    await tab.wait_for("Number(document.body.dataset.refreshes) >= 1")
    assert await tab.evaluate("document.cookie") == ""  # HttpOnly: the page's script cannot read it
    assert await tab.evaluate("document.getElementById('problem').hidden")
    assert await tab.evaluate("fetch('/stats').then((r) => r.status)") == 200


async def test_the_totals_and_the_sessions_table_are_what_stats_and_sessions_say(rig: Rig) -> None:
    tab = await rig.signed_in_tab()
    totals, rows = (await rig.get("/stats"))["totals"], await rig.get("/sessions")

    figures = await tab.evaluate(f"{FIGURES}('#totals')")
    names = ["saved_usd", "cost_usd", "direct_cost_usd", "tokens_before_total", "tokens_after_total"]
    names += ["cache_hit_rate", "overflows_rescued", "recall_misses", "sessions", "turns"]
    assert {name: figures[name] for name in names} == {
        name: [totals[name], shown(name, totals[name])] for name in names
    }
    assert totals["saved_usd"] > 0 and totals["overflows_rescued"] >= 1 and totals["sessions"] == 3

    table = dict(await tab.evaluate(ROWS))
    assert list(table) == [row["key"] for row in rows]  # most recent first, as /sessions lists them
    for row in rows:
        cells = table[row["key"]]
        assert cells.pop("id")[1] == row["id"]
        assert cells.pop("last_seen")[0] == row["last_seen"]
        assert cells == {name: [row[name], row[name] or "–" if name in ("api", "model") else shown(name, row[name])]
                         for name in cells}  # fmt: skip
    apis = {row["id"]: (row["api"], row["model"]) for row in rows}
    assert apis["dash-chat"] == ("chat", CHAT_MODEL) and apis["dash-claude"] == ("messages", CLAUDE_MODEL)
    assert all(url.startswith(rig.proxy.root + "/") for url in tab.requested())  # nothing from elsewhere
    assert tab.problems() == []


async def open_session(tab: Tab, key: str) -> None:
    await tab.evaluate(f"document.querySelector(`#sessions tr[data-key=${{CSS.escape({json.dumps(key)})}}]`).click()")
    await tab.wait_for(f"!document.getElementById('session').hidden && document.querySelector('#session-title "
                       f"[data-field=id]')?.textContent === {json.dumps(key.split('@')[0])}")  # fmt: skip


async def test_a_session_view_charts_each_turn_as_sessions_id_reports_it(rig: Rig) -> None:
    tab = await rig.signed_in_tab()
    key = await rig.key_of("dash-chat")
    await open_session(tab, key)
    detail = await rig.get(f"/sessions/{key}")
    details = detail["turn_details"]

    figures = await tab.evaluate(f"{FIGURES}('#session-figures')")
    for name in ("saved_usd", "cost_usd", "direct_cost_usd", "tokens_before_total", "tokens_after_total", "turns"):
        assert figures[name] == [detail[name], shown(name, detail[name])]
    assert figures["epochs"][0] == detail["epochs"] >= 1

    fields = ["turn", "tokens_before", "tokens_after", "prompt_tokens", "cached_tokens", "epoch", "cost_usd"]
    fields += ["direct_cost_usd", "cumulative_cost_usd", "cumulative_direct_cost_usd"]
    turns = await tab.wait_for(f"(() => {{ const t = {TURNS}; return t.length === {len(details)} && t; }})()")
    assert turns[::-1] == [{name: t[name] for name in fields} for t in details]  # newest first
    for chart, series in [
        ("tokens-chart", "tokens_before"),
        ("tokens-chart", "tokens_after"),
        ("cost-chart", "cumulative_cost_usd"),
        ("cost-chart", "cumulative_direct_cost_usd"),
    ]:
        assert await tab.evaluate(f"{POINTS}('{chart}', '{series}')") == [t[series] for t in details]  # fmt: skip
    epochs = await tab.evaluate("[...document.querySelectorAll('#tokens-chart line.epoch[data-turn]')]"
                                ".map((l) => Number(l.dataset.turn))")  # fmt: skip
    assert epochs == [t["turn"] for t in details if t["epoch"]] != []
    assert details[-1]["cumulative_cost_usd"] < details[-1]["cumulative_direct_cost_usd"]
    assert tab.problems() == []


async def test_a_new_turn_appears_while_the_page_is_open(rig: Rig) -> None:
    tab = await rig.signed_in_tab()
    key = await rig.key_of("dash-chat")
    await open_session(tab, key)
    before = (await rig.get(f"/sessions/{key}"))["turns"]
    await tab.wait_for(f"document.querySelectorAll('#turns tbody tr').length === {before}")
    await tab.evaluate("window.__same_page = true")

    await replay(rig.proxy.root, "dash-chat", range(before, before + 1))  # the next turn

    await tab.wait_for(f"document.querySelectorAll('#turns tbody tr').length === {before + 1}")
    detail, totals = await rig.get(f"/sessions/{key}"), (await rig.get("/stats"))["totals"]
    await tab.wait_for(f"{FIGURES}('#totals').turns[0] === {totals['turns']}")
    assert await tab.evaluate("window.__same_page") is True  # drawn in place: no reload
    newest = (await tab.evaluate(TURNS))[0]
    assert newest["turn"] == detail["turn_details"][-1]["turn"] == before + 1
    assert newest["cumulative_cost_usd"] == detail["cost_usd"]
    assert (await tab.evaluate(f"{FIGURES}('#session-figures')"))["saved_usd"][0] == detail["saved_usd"]


async def test_a_hostile_session_id_and_model_are_shown_as_text(rig: Rig) -> None:
    tab = await rig.signed_in_tab()
    key = await rig.key_of(HOSTILE_ID)
    table = dict(await tab.evaluate(ROWS))
    assert table[key]["id"][1] == HOSTILE_ID and table[key]["model"][1] == HOSTILE_MODEL

    await open_session(tab, key)
    title = await tab.evaluate("document.getElementById('session-title').textContent")
    assert HOSTILE_ID in title and HOSTILE_MODEL in title
    assert await tab.evaluate("document.querySelectorAll('main img').length") == 0
    assert await tab.evaluate("[...document.querySelectorAll('main svg')].every((s) => s.closest('.chart'))")
    assert await tab.evaluate("window.__pwned") is None
    assert tab.problems() == []
