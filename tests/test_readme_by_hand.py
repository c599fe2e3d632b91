"""What the README tells a new user to paste works as pasted: the by-hand block, its session ids, deploy/'s config."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from proxy.config.loader import load_settings
from tests.harness import closed_port
from tests.test_first_contact import packaged_proxy

__all__ = ["packaged_proxy"]  # the fixture this module uses

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def by_hand_block() -> str:
    """The README's first bash block after "Try it by hand"."""
    tail = README[README.index("Try it by hand") :]
    return re.search(r"```bash\n(.*?)```", tail, re.S).group(1)


def test_the_by_hand_block_runs_as_pasted_and_answers_every_api() -> None:
    block = by_hand_block()
    assert "kill %1 %2" in block  # it cleans up after itself
    # The same lines on free ports (this machine may run other proxies), run by this checkout's Python.
    sim, proxy = closed_port(), closed_port()
    script = block.replace("9000", str(sim)).replace("8787", str(proxy))
    script = script.replace("context-proxy simulate", f"context-proxy simulate --port {sim}")
    script = script.replace("context-proxy serve", f"context-proxy serve --port {proxy}")
    script = script.replace("context-proxy ", f"{sys.executable} -m proxy ")
    run = subprocess.Popen(
        ["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, err
    assert out.count("data: [DONE]") == 1  # chat completions, streamed to its end
    assert "event: response.completed" in out  # Responses
    assert "event: message_stop" in out  # Anthropic Messages, through --anthropic-upstream: no key, no network
    answered = re.findall(r"POST (/v1/\S+) (\d{3}) ", err)  # the proxy's access log
    assert answered == [("/v1/chat/completions", "200"), ("/v1/responses", "200"), ("/v1/messages", "200")], err
    assert "Traceback" not in err, err


async def test_the_readmes_example_session_is_left_alone_by_the_shipped_session_files(packaged_proxy) -> None:
    """The SDK example's named session takes no capsule from the packaged sessions/ examples: "hi" goes as sent."""
    (session,) = set(re.findall(r'base_url="http://127\.0\.0\.1:8787/s/([\w-]+)/v1"\)  # or name the session', README))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{packaged_proxy}/s/{session}/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        assert response.headers["X-Context-Tokens-After"] == response.headers["X-Context-Tokens-Before"]
        assert response.headers["X-Context-Diff"].startswith("added=0 ")


def test_deploys_config_keeps_the_packaged_model_table() -> None:
    """compose.yaml's deploy/proxy.toml names no [models]: it takes the packaged table, windows and prices."""
    deploy, packaged = load_settings(ROOT / "deploy" / "proxy.toml"), load_settings()
    assert "\n[models" not in (ROOT / "deploy" / "proxy.toml").read_text()
    assert deploy.models == packaged.models
    assert deploy.model("gpt-5").context_window == 400_000
    claude = deploy.model("claude-sonnet-4-5")
    assert claude.pattern != "*" and claude.input_per_mtok > 0 and claude.cache_write_per_mtok > claude.input_per_mtok
