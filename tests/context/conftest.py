import pytest


@pytest.fixture(scope="module")
def real_counter():
    """The o200k tokenizer the engine counts with in production."""
    from proxy.tokens.counter import counter_for

    return counter_for("o200k_base")
