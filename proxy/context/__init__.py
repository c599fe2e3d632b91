"""The pure context engine: data in, data out; no I/O, no asyncio, no clocks."""

from proxy.context.policy import CapsulePolicy, ClearPolicy, ModelInfo, Policy, policy_from_dict
from proxy.context.tokens import Counter, HeuristicCounter

__all__ = [
    "CapsulePolicy",
    "ClearPolicy",
    "Counter",
    "HeuristicCounter",
    "ModelInfo",
    "Policy",
    "policy_from_dict",
]
