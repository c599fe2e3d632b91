"""A real headless Chromium for tests, driven over the DevTools protocol with aiohttp's WebSocket client.

`.ci/run` installs Debian's `chromium`. A machine without it fails the tests that use it (never skips them):
a dashboard test skipped in CI would prove nothing. `CHROMIUM` names another binary.

Chromium starts with a fresh profile, no sandbox (containers run as root), nothing of its own on the network
(no QUIC, no background fetches, no component updates, no sync), and a DevTools port it picks itself: it
writes the port to `DevToolsActivePort` in the profile, read here. One tab, attached by a flat session; every
page event is kept (`Tab.events`), so a test can say what the page logged, threw or requested.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

START_TIMEOUT_S = 60.0  # two shared cores, a cold start
COMMAND_TIMEOUT_S = 30.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # a container's /dev/shm is small
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


def chromium_binary() -> str:
    """Chromium's path; an AssertionError saying how to get it when it is missing."""
    name = os.environ.get("CHROMIUM", "chromium")
    found = shutil.which(name)
    assert found, f"{name} is not installed: apt-get install chromium (.ci/run does), or set CHROMIUM"
    return found


class DevToolsError(Exception):
    """A DevTools command failed, or the page threw while evaluating an expression."""


class Tab:
    """One page of the browser: commands sent by its session id, its events kept in order."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self.browser, self.session_id = browser, session_id
        self.events: list[dict[str, Any]] = []
        self._loaded = asyncio.Event()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, session_id=self.session_id, **params)

    def _event(self, message: dict[str, Any]) -> None:
        self.events.append(message)
        if message["method"] == "Page.loadEventFired":
            self._loaded.set()

    async def goto(self, url: str) -> None:
        """Open `url` and wait for its load event."""
        self._loaded.clear()
        answer = await self.send("Page.navigate", url=url)
        if answer.get("errorText"):
            raise DevToolsError(f"{url}: {answer['errorText']}")
        await asyncio.wait_for(self._loaded.wait(), COMMAND_TIMEOUT_S)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise awaited), as JSON brings it."""
        answer = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise DevToolsError(details.get("exception", {}).get("description") or details.get("text"))
        return answer["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = COMMAND_TIMEOUT_S) -> Any:
        """The expression's first truthy value, evaluated every 100 ms; DevToolsError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not (value := await self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise DevToolsError(f"still false after {timeout_s:.0f} s: {expression}")
            await asyncio.sleep(0.1)
        return value

    def requested(self) -> list[str]:
        """Every URL the page asked for (Network events), in order."""
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def problems(self) -> list[str]:
        """What the page threw or the browser logged as an error (a CSP violation, a failed load)."""
        out = []
        for event in self.events:
            method, params = event["method"], event["params"]
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                out.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"]["text"])
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        return out


class Browser:
    """A headless Chromium process and the DevTools WebSocket to it."""

    def __init__(self, process: subprocess.Popen, profile: Path, client: aiohttp.ClientSession) -> None:
        self.process, self.profile, self.client = process, profile, client
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tabs: dict[str, Tab] = {}
        self._reader: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        active = self.profile / "DevToolsActivePort"
        while not (active.exists() and len(lines := active.read_text().split()) == 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise DevToolsError(f"chromium did not start:\n{self.log()}")
            await asyncio.sleep(0.1)
        port, path = lines
        self.ws = await self.client.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        self._reader = asyncio.create_task(self._read())

    def log(self) -> str:
        path = self.profile / "chromium.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    async def _read(self) -> None:
        assert self.ws is not None
        async for frame in self.ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                break
            message = frame.json()
            if "id" in message:
                future = self._waiting.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif (tab := self._tabs.get(message.get("sessionId", ""))) is not None:
                tab._event(message)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(DevToolsError(f"the DevTools connection closed:\n{self.log()}"))

    async def send(self, method: str, *, session_id: str | None = None, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result, or DevToolsError with the browser's message."""
        assert self.ws is not None
        number = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[number] = future
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if session_id is not None:
            message["sessionId"] = session_id
        await self.ws.send_json(message)
        answer = await asyncio.wait_for(future, COMMAND_TIMEOUT_S)
        if "error" in answer:
            raise DevToolsError(f"{method}: {answer['error'].get('message')}")
        return dict(answer["result"])

    async def new_tab(self) -> Tab:
        """A blank tab in a browser context of its own (its own cookies and storage, as a fresh incognito
        window), with its page, runtime, log and network events on."""
        context = await self.send("Target.createBrowserContext")
        target = await self.send("Target.createTarget", url="about:blank", browserContextId=context["browserContextId"])
        attached = await self.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        tab = self._tabs[attached["sessionId"]] = Tab(self, attached["sessionId"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            await tab.send(f"{domain}.enable")
        return tab

    async def close(self) -> None:
        if self.ws is not None and not self.ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send("Browser.close"), 5)
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium with a fresh profile, closed (and its profile removed) on exit."""
    binary = chromium_binary()
    profile = Path(tempfile.mkdtemp(prefix="chromium-"))
    with (profile / "chromium.log").open("wb") as log:
        process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    client = aiohttp.ClientSession()
    browser = Browser(process, profile, client)
    try:
        await browser.connect()
        yield browser
    finally:
        await browser.close()
        await client.close()
