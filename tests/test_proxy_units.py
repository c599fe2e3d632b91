"""The shell's small pieces without sockets: body checks, the metrics registry, the CLI, header filtering."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from proxy import cli
from proxy.config.loader import ConfigHolder, load_settings
from proxy.dialects.body_checks import InvalidRequest, parse_chat_body
from proxy.metrics import Registry
from proxy.shell.upstream import Upstream, end_to_end


def test_well_formed_bodies_pass_validation_unchanged():
    raw = (
        b'{"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": '
        b'[{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": null, "tool_calls": null}, '
        b'{"role": "tool", "tool_call_id": "c", "content": "out"}], "extra": {"kept": true}}'
    )
    body = parse_chat_body(raw)
    assert body["extra"] == {"kept": True} and len(body["messages"]) == 4


def test_validation_names_the_offending_index():
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_body(b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 1.5}]}')
    assert caught.value.param == "messages[1].content"
    assert "messages[1].content" in caught.value.message


def test_registry_renders_prometheus_text():
    registry = Registry()
    requests = registry.counter("demo_requests_total", "Requests", ["route", "status"])
    requests.inc(route="chat", status="200")
    requests.inc(2, route="chat", status="200")
    latency = registry.histogram("demo_latency_seconds", "Latency", ["route"], buckets=(0.1, 1))
    latency.observe(0.05, route="chat")
    latency.observe(5, route="chat")
    streams = registry.gauge("demo_streams", "Streams")
    streams.inc()
    text = registry.render()
    assert '# TYPE demo_requests_total counter\ndemo_requests_total{route="chat",status="200"} 3' in text
    assert 'demo_latency_seconds_bucket{route="chat",le="0.1"} 1' in text
    assert 'demo_latency_seconds_bucket{route="chat",le="1"} 1' in text
    assert 'demo_latency_seconds_bucket{route="chat",le="+Inf"} 2' in text
    assert 'demo_latency_seconds_sum{route="chat"} 5.05' in text
    assert "demo_streams 1" in text
    assert registry.counter("demo_requests_total", "Requests", ["route", "status"]) is requests
    with pytest.raises(ValueError):
        registry.gauge("demo_requests_total", "Requests", ["route", "status"])
    with pytest.raises(ValueError):
        requests.inc(route="chat")


def test_hop_by_hop_and_connection_named_headers_are_not_forwarded():
    headers = CIMultiDict(
        {"Connection": "close, X-Private", "X-Private": "1", "Transfer-Encoding": "chunked", "TE": "trailers"}
    )
    headers.add("X-Kept", "a")
    headers.add("X-Kept", "b")
    assert list(end_to_end(headers).items()) == [("X-Kept", "a"), ("X-Kept", "b")]


def test_upstream_urls_keep_the_configured_host_and_base_path():
    holder = ConfigHolder(load_settings(None, "https://api.example.com/openai/v1/"))
    upstream = Upstream(holder)
    url = upstream.url_for("files/a%2Fb", "x=1")
    assert str(url) == "https://api.example.com/openai/v1/files/a%2Fb?x=1"
    assert upstream.url_for("//evil.example/v1/models").host == "api.example.com"


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["demo", "--help"], ["simulate", "--help"]])
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 0
    assert "usage: context-proxy" in capsys.readouterr().out


def test_serve_defaults_come_from_the_config(monkeypatch):
    served = {}
    monkeypatch.setattr(
        "proxy.shell.server.serve",
        lambda holder, host, port, context, reuse_port=False: served.update(host=host, port=port),
    )
    assert cli.main(["serve", "--passthrough", "--upstream", "http://127.0.0.1:9/v1"]) == 0
    assert served == {"host": "127.0.0.1", "port": 8787}
    assert cli.main(["serve", "--passthrough", "--port", "9001", "--host", "0.0.0.0"]) == 0
    assert served == {"host": "0.0.0.0", "port": 9001}


def test_a_broken_config_is_a_clear_exit_code(tmp_path):
    bad = tmp_path / "proxy.toml"
    bad.write_text("[server\n")
    assert cli.main(["serve", "--config", str(bad)]) == 2


def test_an_unusable_state_path_is_a_clear_start_up_error(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the state folder should be")
    config = tmp_path / "proxy.toml"
    config.write_text(f'[state]\npath = "{blocker}/journals.sqlite"\n')
    assert cli.main(["serve", "--config", str(config)]) == 2
    assert "cannot use it as the session store" in caplog.text
