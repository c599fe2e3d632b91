"""A capsule removed or changed in the config leaves the body in an epoch it causes; the diff says so."""

from proxy.context import Capsule, HeuristicCounter
from proxy.context.journal import Journal
from proxy.context.pipeline import process
from proxy.context.policy import ModelInfo, Policy


def turn(journal: Journal, messages: list[dict], capsules: list[Capsule]):
    outcome = process(
        journal, messages, tools=None, policy=Policy(), model=ModelInfo(), counter=HeuristicCounter(), capsules=capsules
    )
    body = "\n".join(str(m.get("content")) for m in outcome.messages)
    return outcome, body


def test_a_changed_then_removed_capsule_leaves_the_body():
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Run the tests."}]
    first, body = turn(Journal(), history, [Capsule(id="tests", kind="convention", text="Use pytest -q.")])
    assert "Use pytest -q." in body and not first.report.epoch

    history += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again, please."}]
    changed, body = turn(first.journal, history, [Capsule(id="tests", kind="convention", text="Use pytest -x.")])
    assert "Use pytest -x." in body and "Use pytest -q." not in body
    assert changed.report.epoch and "capsules" in changed.report.reasons
    assert changed.report.diff.summary().startswith("added=1") and "removed=1" in changed.report.diff.summary()

    history += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Once more."}]
    removed, body = turn(changed.journal, history, [])
    assert "pytest" not in body and removed.report.epoch and "removed=1" in removed.report.diff.summary()


class CountingCounter(HeuristicCounter):
    """The heuristic counter, noting every text it was asked to count."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def count_text(self, text: str) -> int:
        self.texts.append(text)
        return super().count_text(text)


def test_a_kept_capsule_is_counted_once_however_many_turns_score_it():
    """A big capsule costs its reading once, not every turn (#29 item 13: 20 MB, 2.5 s a turn)."""
    capsule = Capsule(id="guide", kind="convention", text="Run the tests with pytest -q before committing. " * 20)
    counter, journal = CountingCounter(), Journal()
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Run the tests with pytest."}]
    for k in range(4):
        outcome = process(
            journal, history, tools=None, policy=Policy(), model=ModelInfo(), counter=counter, capsules=[capsule]
        )
        journal = outcome.journal
        history = [*history, {"role": "assistant", "content": f"Done {k}."}, {"role": "user", "content": "Again."}]
    assert "pytest -q" in str(journal.injections[0].text)
    assert counter.texts.count(capsule.text) == 1
