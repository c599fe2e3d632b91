"""Benchmarks for context-proxy: `python -m bench overhead|scaling|memory|savings|profile|smoke`.

Every figure is reported next to a reference run alongside (the simulator direct, the bare
relay in bench/relay.py, an orjson round trip); BENCHMARKS.md holds the results and commands.
"""
