"""The pure context engine: data in, data out; no I/O, no asyncio, no clocks."""

from proxy.context.capsules import Capsule, ContextBundle, ContextRequest, select_capsules
from proxy.context.clearing import Cleared, ClearPlan, ClearToolOutputs
from proxy.context.diff import ContextBlock, ContextDiff, build_context_diff
from proxy.context.economics import Bill, bill, epoch_pays
from proxy.context.journal import Decision, Journal, TurnReport
from proxy.context.pipeline import Outcome, process
from proxy.context.policy import CapsulePolicy, ClearPolicy, ModelInfo, Policy, policy_from_dict
from proxy.context.tokens import Counter, HeuristicCounter
from proxy.context.window import ContextError, ContextWindow, TruncationStrategy

__all__ = [
    "Bill",
    "Capsule",
    "CapsulePolicy",
    "ClearPlan",
    "ClearPolicy",
    "ClearToolOutputs",
    "Cleared",
    "ContextBlock",
    "ContextBundle",
    "ContextDiff",
    "ContextError",
    "ContextRequest",
    "ContextWindow",
    "Counter",
    "Decision",
    "HeuristicCounter",
    "Journal",
    "ModelInfo",
    "Outcome",
    "Policy",
    "TruncationStrategy",
    "TurnReport",
    "bill",
    "build_context_diff",
    "epoch_pays",
    "policy_from_dict",
    "process",
    "select_capsules",
]
