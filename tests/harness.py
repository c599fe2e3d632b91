"""A real proxy in front of the simulator, both on 127.0.0.1 ephemeral ports, for the robustness tests.

`Rig` starts the simulator (or takes any upstream URL), builds Settings in code and serves
the proxy with the access middleware installed; the tests talk to it over real sockets.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
import subprocess
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from proxy.config.loader import ConfigHolder
from proxy.config.settings import AnthropicConfig, AuthConfig, ServerConfig, Settings, StateConfig, UpstreamConfig
from proxy.demo.simulator import SIMULATOR, Simulator, SimulatorConfig, start_simulator
from proxy.shell.server import UPSTREAM, create_app, serve_app

# Every robustness test runs against the pass-through shell and against the real ContextService.
ENGINES = [pytest.param(False, id="passthrough"), pytest.param(True, id="engine")]


def listening_port(process: subprocess.Popen[str]) -> int:
    """The port a `context-proxy serve` subprocess bound, from its start-up line on stderr."""
    for line in process.stderr or ():
        if found := re.search(r"listening on http://[^:]+:(\d+)", line):
            return int(found[1])
    raise AssertionError("the proxy exited before listening")


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_settings(upstream_url: str, **sections: Any) -> Settings:
    """Settings for tests: `server=`, `upstream=`, `anthropic=`, `state=`, `auth=` dicts override the defaults."""
    settings = Settings(
        upstream=UpstreamConfig(base_url=upstream_url, connect_timeout_s=2, read_timeout_s=5),
        anthropic=AnthropicConfig(base_url=upstream_url.removesuffix("/v1")),  # one test upstream speaks every API
    )
    classes = {
        "server": ServerConfig, "upstream": UpstreamConfig, "anthropic": AnthropicConfig, "state": StateConfig,
        "auth": AuthConfig,
    }  # fmt: skip
    for name, overrides in sections.items():
        if name == "policy":
            from proxy.context.policy import policy_from_dict

            settings = replace(settings, policy_data=overrides, policy=policy_from_dict(overrides))
            continue
        assert name in classes, name
        settings = replace(settings, **{name: replace(getattr(settings, name), **overrides)})
    return settings


async def serve_proxy(holder: ConfigHolder, context: Any = None, outer: tuple = ()) -> tuple[web.AppRunner, int]:
    """What server.start() serves, with `outer` middlewares in front (tests use them to fake a client's address)."""
    app = create_app(holder, context=context)
    for middleware in reversed(outer):
        app.middlewares.insert(0, middleware)
    return await serve_app(app)


@dataclass
class Rig:
    """A running simulator and proxy; `await rig.close()` stops both."""

    holder: ConfigHolder
    proxy_runner: web.AppRunner
    port: int
    sim_runner: web.AppRunner | None = None
    context: Any = None
    sim_url: str = ""  # the upstream's base URL, ending in /v1
    extra: list[web.AppRunner] = field(default_factory=list)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def sim(self) -> Simulator:
        assert self.sim_runner is not None
        return self.sim_runner.app[SIMULATOR]

    @property
    def connector(self) -> aiohttp.BaseConnector:
        session = self.proxy_runner.app[UPSTREAM]._session
        assert session is not None
        return session.connector

    def upstream_in_use(self) -> int:
        """Upstream connections checked out of the proxy's pool right now."""
        return len(self.connector._acquired)  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self.proxy_runner.cleanup()
        store = getattr(self.context, "store", None)
        if store is not None:
            store.close()
        for runner in [self.sim_runner, *self.extra]:
            if runner is not None:
                await runner.cleanup()


async def start_rig(
    *,
    sim_config: SimulatorConfig | None = None,
    upstream_url: str | None = None,
    engine: bool = False,
    context: Any = None,
    outer: tuple = (),
    **sections: Any,
) -> Rig:
    """Simulator (unless `upstream_url`) + proxy; `engine=True` runs the real ContextService, `context=` any other."""
    assert not (engine and context is not None), "engine=True or context=, not both"
    sim_runner = None
    if upstream_url is None:
        sim_runner, upstream_url = await start_simulator(sim_config)
    holder = ConfigHolder(make_settings(upstream_url, **sections))
    if engine:
        from proxy.service.engine_service import build_context_service

        context = build_context_service(holder)
    runner, port = await serve_proxy(holder, context, outer)
    return Rig(holder, runner, port, sim_runner, context, upstream_url)


class ChatUpstream:
    """A bare upstream on 127.0.0.1: a subclass's `answer` replies to every POST to `paths` (chat completions
    unless told); `start()` gives the base URL a proxy points at, `runner.cleanup()` stops it."""

    def __init__(self, max_body: int = 128 * 1024 * 1024, paths: tuple[str, ...] = ("/v1/chat/completions",)) -> None:
        self.app = web.Application(client_max_size=max_body)
        for path in paths:
            self.app.router.add_post(path, self.answer)
        self.runner = web.AppRunner(self.app)

    async def start(self) -> str:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError


def chat_body(text: str = "Say hello.", *, stream: bool = False, model: str = "gpt-4o", **extra: Any) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream, **extra}


async def settle(predicate: Any, timeout: float = 2.0, step: float = 0.01) -> bool:
    """Poll `predicate()` (a bool, or an awaitable of one) until true or `timeout`; True if it became true."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if await _truth(predicate()):
            return True
        await asyncio.sleep(step)
    return await _truth(predicate())


async def _truth(value: Any) -> bool:
    return bool(await value) if inspect.isawaitable(value) else bool(value)


# A tool-calling agent's one tool, as `scripted_agent` calls it.
BASH_TOOL = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


async def scripted_agent(
    url: str, sim: Simulator, steps: int, step: Any, model: str = "gpt-4o"
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """An agent's run through the official SDK at `url` (a proxy's `/s/{id}/v1`): after a system prompt and a
    task, turn `k` appends the agent's call to `bash` and its output, `step(k) -> (text, arguments, output)`, and
    sends the conversation. Returns the agent's messages and what reached the simulator each turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the header parsing bug."},
    ]
    upstream = []
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0) as sdk:
        for k in range(steps):
            text, arguments, output = step(k)
            call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
            messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": output})
            await sdk.chat.completions.create(model=model, messages=messages, tools=BASH_TOOL)  # type: ignore[arg-type]
            upstream.append(sim.requests[-1].body["messages"])
    return messages, upstream


def is_openai_error(payload: Any) -> bool:
    """OpenAI's error shape: {"error": {"message": str, "type": str, "code": ...}}."""
    error = payload.get("error") if isinstance(payload, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and "code" in error
    )
