"""Every config key checked against the dataclass that holds it, each mistake reported as one line.

The schema is the dataclasses themselves (`proxy.config.settings`' sections, `Policy`, `ModelInfo`): a
pydantic model is derived from each, so a new field is a new key with its type checked, and a new
section is a new dataclass field of `Settings`. Types are strict (`"32"` is not a number), unknown
keys are refused with the closest known one, numbers are never negative, `*_patterns` must compile under RE2.
`RULES` holds what a type cannot say (ranges, choices); adding one is one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from proxy.context.patterns import pattern_problem
from proxy.context.policy import MODES, TRUNCATIONS
from proxy.tokens.encodings import PACKAGED_FILES

T = TypeVar("T")


def _http_url(url: str) -> str:
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(
            f"should be an http:// or https:// URL with a host, like https://api.openai.com/v1, not {url!r}"
        )
    return url


def _redis_url(url: str) -> str:
    if url and urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"should be a redis://, rediss:// or unix:// URL, like redis://127.0.0.1:6379/0, not {url!r}")
    return url


def _regexes(patterns: tuple[str, ...]) -> tuple[str, ...]:
    if problem := pattern_problem(patterns):  # as the engine will run them (RE2)
        raise ValueError(problem)
    return patterns


SHARE = Field(gt=0, le=1)
# "Class.field": what the field's type cannot say. Every other number only has to be >= 0.
RULES: dict[str, Any] = {
    "ServerConfig.port": Field(ge=0, le=65535),  # 0: any free port
    "ServerConfig.max_body_mb": Field(gt=0),
    "ServerConfig.max_connections": Field(ge=1),
    "ServerConfig.header_timeout_s": Field(gt=0),
    "ServerConfig.body_timeout_s": Field(gt=0),
    "ServerConfig.keepalive_timeout_s": Field(gt=0),
    "ServerConfig.websocket_heartbeat_s": Field(gt=0),
    "ServerConfig.websocket_idle_timeout_s": Field(gt=0),
    "ServerConfig.body_budget_mb": Field(gt=0),
    "UpstreamConfig.base_url": AfterValidator(_http_url),
    "AnthropicConfig.base_url": AfterValidator(_http_url),
    "UpstreamConfig.connect_timeout_s": Field(gt=0),
    "UpstreamConfig.read_timeout_s": Field(gt=0),
    "StateConfig.max_sessions": Field(ge=1),
    "StateConfig.max_session_kb": Field(gt=0),
    "StateConfig.memory_mb": Field(gt=0),
    "StateConfig.redis_url": AfterValidator(_redis_url),
    "StateConfig.redis_timeout_ms": Field(gt=0),
    "StateConfig.redis_retry_s": Field(ge=0),
    "Policy.truncation": Literal[TRUNCATIONS],
    "Policy.mode": Literal[MODES],
    "Policy.high_water": SHARE,
    "Policy.low_water": SHARE,
    "Policy.max_message_share": SHARE,
    "Policy.agent_message_tokens": Field(ge=0),
    "Policy.agent_messages_kept": Field(ge=0),
    "Policy.first_edit_risk_turns": Field(ge=0, allow_inf_nan=False),  # inf x a later edit's 0 would be nan
    "Policy.bet_overrun": Field(ge=0, allow_inf_nan=False),
    "Policy.session_end_idle_s": Field(gt=0, allow_inf_nan=False),
    "ClearPolicy.miss_keep_tokens": Field(ge=0),
    "ClearPolicy.stub_tokens": Field(ge=0),
    "ClearPolicy.forced_stub_tokens": Field(ge=0),
    "ModelInfo.context_window": Field(ge=1),
    "ModelInfo.encoding": Literal[tuple(PACKAGED_FILES)],
    "ModelInfo.cache_ttl_s": Field(ge=0),
    "CapsuleSpec.confidence": Field(ge=0, le=1),
    "Settings.default_encoding": Literal[tuple(PACKAGED_FILES)],
}
_STRICT = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class ConfigError(ValueError):
    """A config file that cannot be used: one line with its path, line, key and the problem."""


@dataclass(frozen=True)
class Source:
    """A config file's path and text, to name the line a key is on."""

    path: Path
    text: str = ""

    def error(self, table: Sequence[str | int], key: str | None, problem: str) -> ConfigError:
        """`path:line: [table] key: problem` (the line where it can be found); a flag's value: `--flag: problem`."""
        if str(self.path).startswith("--"):
            return ConfigError(f"{self.path}: {problem}")
        line = _line_of(self.text, table, key)
        where = f"{self.path}:{line}" if line else str(self.path)
        name = _table_name(table)
        subject = " ".join(part for part in (f"[{name}]" if name else "", key or "") if part)
        return ConfigError(f"{where}: {subject}: {problem}" if subject else f"{where}: {problem}")

    def refuse_unknown(self, data: dict[str, Any], known: Iterable[str], table: Sequence[str | int] = ()) -> None:
        """Raise for the first key of `data` not in `known`, with the closest known one."""
        known = list(known)
        for key, value in data.items():
            if key not in known:
                section = isinstance(value, dict)
                problem = f"unknown {'section' if section else 'key'}{_did_you_mean(key, known, section, table)}"
                raise self.error([*table, key] if section else table, None if section else key, problem)


def checked(cls: type[T], data: Any, source: Source, table: Sequence[str | int], **extra: Any) -> T:
    """`data` validated against the dataclass `cls` and built from it; `extra` are fields set by the loader."""
    validate(cls, data, source, table)
    return _build(cls, {**_frozen(data or {}), **extra})


def validate(
    cls: type, data: Any, source: Source, table: Sequence[str | int], only: frozenset[str] | None = None
) -> None:
    """Raise ConfigError (one line) for the first thing in `data` that `cls` (or its fields `only`) cannot take."""
    if only is not None and isinstance(data, dict):
        data = {key: value for key, value in data.items() if key in only}
    try:
        _model(cls, only).model_validate(_frozen(data if data is not None else {}))
    except ValidationError as exc:
        error = exc.errors()[0]
        loc: list[Any] = list(error["loc"])
        item = ""
        while loc and isinstance(loc[-1], int):
            item = f"item {loc.pop() + 1}: {item}"
        *inner, last = loc or [None]
        raise source.error([*table, *inner], last, item + _problem(error, cls, inner, last)) from None


def _problem(error: Any, cls: type, inner: list[Any], key: Any) -> str:
    if error["type"] == "extra_forbidden":
        owner = functools.reduce(_field_type, inner, cls)
        known = [f.name for f in dataclasses.fields(owner) if f.init]
        return f"unknown key{_did_you_mean(str(key), known, False, ())}"
    if error["type"] == "missing":
        return "required key missing"
    message = error["msg"].replace("Input should be", "should be").replace("Value error, ", "")
    message = message.replace("a valid tuple", "a list").replace("a valid dictionary", "a table")
    message = re.sub(r" or instance of \w+", "", message)
    return message if error["type"] == "value_error" or "input" not in error else f"{message}, not {error['input']!r}"


def _field_type(cls: type, name: Any) -> type:
    hint = typing.get_type_hints(cls).get(name) if dataclasses.is_dataclass(cls) else None
    return cast(type, hint) if dataclasses.is_dataclass(hint) else cls


def _did_you_mean(key: str, known: list[str], section: bool, table: Sequence[str | int]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:
        return f"; known: {', '.join(known)}" if len(known) <= 8 else ""
    return f"; did you mean [{_table_name([*table, close[0]])}]?" if section else f"; did you mean {close[0]!r}?"


@functools.cache
def _model(cls: type, only: frozenset[str] | None = None) -> type[BaseModel]:
    """A strict pydantic model with `cls`'s fields (or `only` these), nested sections and RULES."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init or (only is not None and field.name not in only):
            continue
        hint = hints[field.name]
        rule = RULES.get(f"{cls.__name__}.{field.name}")
        if dataclasses.is_dataclass(hint):
            hint = _model(cast(type, hint))
        elif typing.get_origin(rule) is Literal:
            hint = rule
        elif rule is not None:
            hint = Annotated[hint, rule]
        elif field.name.endswith("_patterns"):
            hint = Annotated[hint, AfterValidator(_regexes)]
        elif hint in (int, float) or typing.get_args(hint) in ((int, type(None)), (float, type(None))):
            hint = Annotated[hint, Field(ge=0)]
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        fields[field.name] = (hint, ... if required else None)  # the dataclass supplies the defaults
    return create_model(f"{cls.__name__}Schema", __config__=_STRICT, **fields)


def _build(cls: type[T], data: dict[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    values = {
        key: _build(hints[key], value) if dataclasses.is_dataclass(hints.get(key)) else value
        for key, value in data.items()
    }
    return cls(**values)


def _frozen(value: Any) -> Any:
    """TOML arrays as tuples (the dataclasses are frozen), recursively."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def _table_name(table: Sequence[str | int]) -> str:
    parts = [p if isinstance(p, int) or re.fullmatch(r"[A-Za-z0-9_-]+", p) else f'"{p}"' for p in table]
    return ".".join(f"#{p + 1}" if isinstance(p, int) else p for p in parts).replace(".#", " #")


_HEADER = re.compile(r"^\s*\[\[?\s*(.+?)\s*\]\]?\s*(#.*)?$")


def _split_dotted(name: str) -> list[str]:
    return [a or b for a, b in re.findall(r'"([^"]*)"|([^.\s"]+)', name)]


def _line_of(text: str, table: Sequence[str | int], key: str | None) -> int | None:
    """The line of `key` in `table`, else of the table's header, as a reader would find it; None if neither."""
    names = [p for p in table if isinstance(p, str)]
    index = next((p for p in table if isinstance(p, int)), 0)
    current: list[str] = []
    seen = 0 if not names else -1  # the top level has no header
    header_line = None
    key_line = re.compile(rf"""^\s*["']?{re.escape(key or "")}["']?\s*=""")
    for number, line in enumerate(text.splitlines(), start=1):
        if header := _HEADER.match(line):
            current = _split_dotted(header[1])
            if current == names:
                seen += 1
                header_line = number if seen == index else header_line
        elif key is not None and current == names and seen == index and key_line.match(line):
            return number
    return header_line
