"""An OpenAI-compatible upstream on localhost, for the tests, the demo and the benchmarks.

It answers and streams like the real API (format copied from tests/data/sse) or replays
streams recorded from it, bills `usage` with `cached_tokens` from a prefix-cache model,
refuses requests over the model's window with OpenAI's exact error, checks tool-call
pairing like OpenAI, and misbehaves on request (`X-Sim-Fault`) so robustness tests have
something to meet. Its token count is the proxy's plus a hidden overhead, so estimates
are close, not exact.

- `model.py`: `SimulatorConfig`, the state (`Simulator`: recorded requests, totals, the prefix cache)
- `answers.py`: the real API's shapes (errors, usage, tool calls, stream chunks)
- `faults.py`: recording, pacing, piece sizes and the faults
- `app.py`: the routes, `create_simulator_app`, `start_simulator`
"""

from proxy.demo.simulator.answers import pairing_error
from proxy.demo.simulator.app import create_simulator_app, start_simulator
from proxy.demo.simulator.faults import BAD_GATEWAY, FAULTS, STATUS_FAULTS
from proxy.demo.simulator.model import SIMULATOR, RecordedRequest, SimTotals, Simulator, SimulatorConfig

__all__ = [
    "BAD_GATEWAY",
    "FAULTS",
    "SIMULATOR",
    "STATUS_FAULTS",
    "RecordedRequest",
    "SimTotals",
    "Simulator",
    "SimulatorConfig",
    "create_simulator_app",
    "pairing_error",
    "start_simulator",
]
