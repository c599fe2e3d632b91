"""A tiny Prometheus text-format registry: counters and gauges with labels, histograms.

Modules register on the shared `METRICS` at import time; registering a name twice
returns the existing metric, so several apps in one process (tests) share them. Every
name starts with `context_proxy_`; a metric without labels reads 0 before its first
change; the standard `process_*` metrics (prometheus_client's collector) follow ours.

Under `serve --workers N` each worker answers `/metrics` for all of them: `share(folder)` makes
every change also land in a memory-mapped file of this process in a folder the workers share
(prometheus_client's `MmapedDict`, the file format of its multiprocess mode: one 16-byte write
per change, no system call), and a scrape adds up every file there. A worker that exited keeps
its file, so a counter never goes back when a worker is restarted; a gauge of what is open now
(`live`) counts only workers that are running (a `live_*` file whose process is gone is skipped).
The `process_*` metrics are one process's, so a shared registry leaves them out, as
prometheus_client's multiprocess mode does.
"""

from __future__ import annotations

import bisect
import math
import os
import threading
from collections.abc import Callable, Iterable
from operator import itemgetter
from pathlib import Path

import orjson
import prometheus_client
from prometheus_client.mmap_dict import MmapedDict

LabelKey = tuple[str, ...]

PREFIX = "context_proxy_"
# CPU seconds, resident memory, open file descriptors, start time (Linux /proc; empty elsewhere).
_PROCESS = prometheus_client.CollectorRegistry(auto_describe=False)
prometheus_client.ProcessCollector(registry=_PROCESS)

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# `serve --workers N` names the folder its workers share their metrics in (proxy/shell/workers.py).
SHARED_DIR_ENV = "CONTEXT_PROXY_METRICS_DIR"


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


class SharedFile:
    """This process's values in a memory-mapped file other processes read (`Registry.share`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = MmapedDict(str(path))
        self._lock = threading.Lock()  # the map is not thread-safe (a new key grows it)
        self._names: dict[tuple[str, int, LabelKey], str] = {}

    def write(self, name: str, index: int, key: LabelKey, value: float) -> None:
        """One value of a metric's series (`index`: 0 for a counter or gauge, a histogram's slot)."""
        with self._lock:
            entry = self._names.get((name, index, key))
            if entry is None:
                entry = self._names[(name, index, key)] = orjson.dumps([name, index, *key]).decode()
            self._file.write_value(entry, value, 0.0)


def read_shared(folder: Path) -> dict[str, dict[LabelKey, dict[int, float]]]:
    """Every process's values in `folder`, added up: metric -> labels -> slot -> value."""
    totals: dict[str, dict[LabelKey, dict[int, float]]] = {}
    for path in sorted(folder.glob("*.db")):
        if path.name.startswith("live_") and not _running(path.stem.removeprefix("live_")):
            continue  # what a worker that exited had open is closed
        try:
            values = list(MmapedDict.read_all_values_from_file(str(path)))
        except (OSError, RuntimeError):  # removed as we read it (a dead worker's live gauges), or torn
            continue
        for entry, value, _timestamp, _pos in values:
            name, index, *labels = orjson.loads(entry)
            slots = totals.setdefault(name, {}).setdefault(tuple(labels), {})
            slots[index] = slots.get(index, 0.0) + value
    return totals


def _running(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process: it is running
        return True
    return True


class _Metric:
    kind = ""
    live = False  # a value of what is open now: only running processes count, under `Registry.share`

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()
        self.shared: SharedFile | None = None  # set by `Registry.share`
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

    def render(self, shared: dict[LabelKey, dict[int, float]] | None = None) -> list[str]:
        """The metric's lines in the Prometheus text format (`shared`: every process's values, added up)."""
        raise NotImplementedError

    def publish(self) -> None:
        """Write every value this process holds to `shared` (once, when it is set)."""
        raise NotImplementedError


class Counter(_Metric):
    """A value that only goes up, one per label combination."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()) -> None:
        super().__init__(name, help, labels)
        self._values: dict[LabelKey, float] = {} if self.label_names else {(): 0}  # unlabelled: 0 from the start

    def inc(self, amount: float = 1, **labels: str) -> None:
        self._add(self._key(labels), amount)

    def labels(self, **labels: str) -> Series:
        """One label combination, its key looked up once: for a series changed on every request."""
        return Series(self, self._key(labels))

    def _add(self, key: LabelKey, amount: float) -> None:
        with self._lock:
            value = self._values[key] = self._values.get(key, 0) + amount
            if self.shared is not None:
                self.shared.write(self.name, 0, key, value)

    def _put(self, key: LabelKey, value: float) -> None:
        with self._lock:
            self._values[key] = value
            if self.shared is not None:
                self.shared.write(self.name, 0, key, value)

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0)

    def render(self, shared: dict[LabelKey, dict[int, float]] | None = None) -> list[str]:
        lines = self.header()
        values = self._values if shared is None else {key: slots.get(0, 0.0) for key, slots in shared.items()}
        for key, value in sorted(values.items(), key=_label_order):
            lines.append(f"{self.name}{_labels(self.label_names, key)} {_number(value)}")
        return lines

    def publish(self) -> None:
        with self._lock:
            for key, value in self._values.items():
                if self.shared is not None:
                    self.shared.write(self.name, 0, key, value)


class Series:
    """One label combination of a counter or gauge (`Counter.labels`): `inc` and `set` skip the label lookup."""

    __slots__ = ("_key", "_metric")

    def __init__(self, metric: Counter, key: LabelKey) -> None:
        self._metric = metric
        self._key = key

    def inc(self, amount: float = 1) -> None:
        self._metric._add(self._key, amount)

    def set(self, value: float) -> None:
        self._metric._put(self._key, value)


class Gauge(Counter):
    """A value that goes up and down: what is open now (in-flight streams; `live`), or a running total."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Iterable[str] = (), live: bool = True) -> None:
        super().__init__(name, help, labels)
        self.live = live

    def dec(self, amount: float = 1, **labels: str) -> None:
        self.inc(-amount, **labels)

    def set(self, value: float, **labels: str) -> None:
        self._put(self._key(labels), value)


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
            if self.shared is not None:
                self._write(key, series, (index, len(series) - 2, len(series) - 1))

    def _write(self, key: LabelKey, series: list[float], slots: Iterable[int]) -> None:
        for slot in slots:
            if 0 <= slot < len(series) and self.shared is not None:
                self.shared.write(self.name, slot, key, series[slot])

    def publish(self) -> None:
        with self._lock:
            for key, series in self._series.items():
                self._write(key, series, range(len(series)))

    def count(self, **labels: str) -> float:
        series = self._series.get(self._key(labels))
        return series[-1] if series else 0

    def render(self, shared: dict[LabelKey, dict[int, float]] | None = None) -> list[str]:
        lines = self.header()
        slots = range(len(self.buckets) + 2)
        every = self._series if shared is None else {k: [v.get(i, 0.0) for i in slots] for k, v in shared.items()}
        for key, series in sorted(every.items(), key=_label_order):
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
        self.shared_dir: Path | None = None  # `share()`: the folder every worker's values are in
        self._files: dict[bool, SharedFile] = {}  # live -> this process's file

    def share(self, folder: str | Path) -> None:
        """Keep this process's values in `folder` too, and render every process's there, added up."""
        self.shared_dir = Path(folder)
        pid = os.getpid()
        folder = self.shared_dir
        self._files = {live: SharedFile(folder / f"{('kept', 'live')[live]}_{pid}.db") for live in (False, True)}
        for metric in self._metrics.values():
            self._attach(metric)

    def _attach(self, metric: _Metric) -> None:
        if self._files:
            metric.shared = self._files[metric.live]
            metric.publish()

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
        self._attach(metric)
        return metric

    def counter(self, name: str, help: str, labels: Iterable[str] = ()) -> Counter:
        return self._register(Counter, name, help, tuple(labels))  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labels: Iterable[str] = (), live: bool = True) -> Gauge:
        """`live`: what is open now (a process that exited counts no more); else a running total."""
        return self._register(Gauge, name, help, tuple(labels), live=live)  # type: ignore[return-value]

    def histogram(
        self, name: str, help: str, labels: Iterable[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> Histogram:
        return self._register(Histogram, name, help, tuple(labels), buckets=tuple(buckets))  # type: ignore[return-value]

    def render(self) -> str:
        lines: list[str] = []
        shared = read_shared(self.shared_dir) if self.shared_dir is not None else None
        for name in sorted(self._metrics):
            lines.extend(self._metrics[name].render(None if shared is None else shared.get(name, {})))
        own = self.process_metrics and shared is None
        process = prometheus_client.generate_latest(_PROCESS).decode() if own else ""
        return "\n".join(lines) + "\n" + process


def share_from_env(registry: Registry | None = None) -> None:
    """A worker of `serve --workers N`: share the metrics in the folder its parent named."""
    if folder := os.environ.get(SHARED_DIR_ENV):
        (registry or METRICS).share(folder)


METRICS = Registry(PREFIX, process_metrics=True)
