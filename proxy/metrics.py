"""A tiny Prometheus text-format registry: counters and gauges with labels, histograms.

Modules register on the shared `METRICS` at import time; registering a name twice
returns the existing metric, so several apps in one process (tests) share them. Every
name starts with `context_proxy_`; a metric without labels reads 0 before its first
change; the standard `process_*` metrics (prometheus_client's collector) follow ours.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable
from operator import itemgetter

import prometheus_client

LabelKey = tuple[str, ...]

PREFIX = "context_proxy_"
# CPU seconds, resident memory, open file descriptors, start time (Linux /proc; empty elsewhere).
_PROCESS = prometheus_client.CollectorRegistry(auto_describe=False)
prometheus_client.ProcessCollector(registry=_PROCESS)

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _no_labels(labels: dict[str, str]) -> LabelKey:
    return ()


def _label_order(item: tuple[LabelKey, object]) -> list[str]:
    return [str(v) for v in item[0]]


def _labels(names: tuple[str, ...], values: LabelKey, extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()
        # Every request increments several metrics: the label tuple is picked in C, not built in a loop.
        names = self.label_names
        self._pick: Callable[[dict[str, str]], LabelKey] = (
            itemgetter(*names) if len(names) > 1 else (lambda labels: (labels[names[0]],)) if names else _no_labels
        )

    def _key(self, labels: dict[str, str]) -> LabelKey:
        if len(labels) == len(self.label_names):
            try:
                return self._pick(labels)
            except KeyError:
                pass
        raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(labels)}")

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        """The metric's lines in the Prometheus text format."""
        raise NotImplementedError


class Counter(_Metric):
    """A value that only goes up, one per label combination."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()) -> None:
        super().__init__(name, help, labels)
        self._values: dict[LabelKey, float] = {} if self.label_names else {(): 0}  # unlabelled: 0 from the start

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0)

    def render(self) -> list[str]:
        lines = self.header()
        for key, value in sorted(self._values.items(), key=_label_order):
            lines.append(f"{self.name}{_labels(self.label_names, key)} {_number(value)}")
        return lines


class Gauge(Counter):
    """A value that goes up and down (in-flight streams)."""

    kind = "gauge"

    def dec(self, amount: float = 1, **labels: str) -> None:
        self.inc(-amount, **labels)

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = value


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labels: Iterable[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> None:
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[LabelKey, list[float]] = {}  # bucket counts..., sum, count
        if not self.label_names:
            self._series[()] = [0.0] * (len(self.buckets) + 2)

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            series = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            index = bisect.bisect_left(self.buckets, value)
            if index < len(self.buckets):
                series[index] += 1
            series[-2] += value
            series[-1] += 1

    def count(self, **labels: str) -> float:
        series = self._series.get(self._key(labels))
        return series[-1] if series else 0

    def render(self) -> list[str]:
        lines = self.header()
        for key, series in sorted(self._series.items(), key=_label_order):
            running = 0.0
            for bound, hits in zip(self.buckets, series, strict=False):
                running += hits
                le = 'le="' + _number(bound) + '"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {_number(running)}")
            inf = _labels(self.label_names, key, 'le="+Inf"')
            lines.append(f"{self.name}_bucket{inf} {_number(series[-1])}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(series[-2])}")
            lines.append(f"{self.name}_count{_labels(self.label_names, key)} {_number(series[-1])}")
        return lines


class Registry:
    """Every metric of the process, rendered together for `GET /metrics`."""

    def __init__(self, prefix: str = "", process_metrics: bool = False) -> None:
        self._metrics: dict[str, _Metric] = {}
        self.prefix = prefix  # every name must start with it
        self.process_metrics = process_metrics

    def _register(self, cls: type, name: str, help: str, labels: Iterable[str], **kwargs: object) -> _Metric:
        if not name.startswith(self.prefix):
            raise ValueError(f"metric {name}: every metric of this registry is named {self.prefix}*")
        existing = self._metrics.get(name)
        if existing is not None:
            if type(existing) is not cls or existing.label_names != tuple(labels):
                raise ValueError(f"metric {name} is already registered with another type or labels")
            return existing
        metric = cls(name, help, labels, **kwargs)
        self._metrics[name] = metric
        return metric

    def counter(self, name: str, help: str, labels: Iterable[str] = ()) -> Counter:
        return self._register(Counter, name, help, tuple(labels))  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labels: Iterable[str] = ()) -> Gauge:
        return self._register(Gauge, name, help, tuple(labels))  # type: ignore[return-value]

    def histogram(
        self, name: str, help: str, labels: Iterable[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> Histogram:
        return self._register(Histogram, name, help, tuple(labels), buckets=tuple(buckets))  # type: ignore[return-value]

    def render(self) -> str:
        lines: list[str] = []
        for name in sorted(self._metrics):
            lines.extend(self._metrics[name].render())
        process = prometheus_client.generate_latest(_PROCESS).decode() if self.process_metrics else ""
        return "\n".join(lines) + "\n" + process


METRICS = Registry(PREFIX, process_metrics=True)
