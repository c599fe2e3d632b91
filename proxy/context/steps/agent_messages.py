"""The agent's older messages, cut head + tail where an epoch re-bills them anyway.

An agent that writes its reasoning out (mini-swe-agent's THOUGHT sections, the scripts in its commands) holds as much
of the request in its own messages as in tool outputs. An epoch re-bills everything after its first change, so
cutting what stands there costs the cache nothing: in each epoch, the agent's messages after that change (all of them
when the cache has expired), but its last `agent_messages_kept`, keep their text's head and tail within
`agent_message_tokens`. Tool calls stay whole (only the text is cut, as `fitting.cut_oversized` does), messages the
dialect marks opaque (thinking, reasoning) are never cut, and nothing is cut in lossless mode. Measured on the traces
(`python -m bench quality`, `python -m bench agent-messages`): BENCHMARKS.md, "The agent's own messages".
"""

from __future__ import annotations

from proxy.context.draft import Draft
from proxy.context.fitting import never_cut
from proxy.context.journal import AS_SENT, DROPPED, TurnReport
from proxy.context.messages import newest
from proxy.context.steps.base import Epoch
from proxy.context.steps.cut import Cutting


class AgentMessages(Cutting):
    """Records `CUT` decisions (`Cutting.cut`): what it sends is `Cutting`'s cut, from the same cache."""

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        policy = draft.policy
        allowance = policy.agent_message_tokens
        if allowance <= 0 or policy.lossless:
            return
        start = -1 if draft.cold else draft.first_decided  # the first message this turn re-bills
        if start is None:
            return
        messages, journal = draft.messages, draft.journal
        decisions = journal.decisions  # (the last render is older than this epoch's truncation: read what it decided)
        agent = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and decisions[i].kind != DROPPED]
        recent = set(agent[max(0, len(agent) - policy.agent_messages_kept) :])
        kept = never_cut(messages, policy.pin_first_user)
        unread, last = newest(messages), len(messages) - 1
        for i in agent:
            if i <= start or i in recent or i in (unread, last) or kept[i]:
                continue
            if decisions[i] is AS_SENT and journal.sent[i] > allowance:  # not edited yet, and long enough to cut
                self.cut(draft, i, allowance, report)
