"""How far our token estimate is from the upstream's count, learned from what it reports.

Pure arithmetic: the shell feeds it the upstream's prompt tokens and our estimate per turn.
"""

from __future__ import annotations

from collections import OrderedDict

# The learned ratio of upstream prompt tokens to our estimate: smoothed, bounded, per model name.
RATIO_SMOOTHING = 0.3
RATIO_BOUNDS = (0.8, 1.5)
RATIO_MIN_ESTIMATE = 256  # below this, fixed overheads dominate and the ratio says little
MAX_MODELS_LEARNED = 256
# A refit aims this much under what the upstream reported, so the retry does not miss by a hair.
REFIT_MARGIN = 1.02
# A refusal that does not state the prompt's size teaches at most this ratio (the window is only a floor) ...
REFIT_MAX_CORRECTION = 2.0
# ... one that states it is the upstream's own count and is believed, up to a bound against a garbled number.
REFIT_MAX_STATED = 16.0


class Calibration:
    """Per model name, upstream prompt tokens per token we estimated (1.0 until learned)."""

    def __init__(self, start: float = 1.0) -> None:
        self.start = start  # the ratio assumed before anything is learned (> 1: a margin for a foreign tokenizer)
        self.ratios: OrderedDict[str, float] = OrderedDict()

    def ratio(self, model: str, start: float | None = None) -> float:
        return self.ratios.get(model, self.start if start is None else start)

    def correction(self, model: str, floor: float = 0.0, start: float | None = None) -> float:
        """The model's learned ratio (`start` until one is learned), never below what a retry taught (`floor`)."""
        return max(self.ratio(model, start), floor)

    def learn(self, model: str, prompt_tokens: int, estimate: float) -> None:
        observed = observed_ratio(prompt_tokens, estimate)
        if observed is None:
            return
        old = self.ratios.pop(model, observed)
        self.ratios[model] = old + RATIO_SMOOTHING * (observed - old)
        while len(self.ratios) > MAX_MODELS_LEARNED:
            self.ratios.popitem(last=False)


def observed_ratio(prompt_tokens: int, estimate: float) -> float | None:
    """What one turn says about the ratio (bounded), or None when the request was too small to say."""
    if estimate < RATIO_MIN_ESTIMATE:
        return None
    return min(RATIO_BOUNDS[1], max(RATIO_BOUNDS[0], prompt_tokens / estimate))


def refit_correction(reported_prompt_tokens: int, estimate: float, *, stated: bool = True) -> float:
    """The correction a context-overflow refusal teaches: aim just under what the upstream counted
    (`stated`: the refusal said so; else `reported_prompt_tokens` is a guess from the window)."""
    bound = REFIT_MAX_STATED if stated else REFIT_MAX_CORRECTION
    return min(bound, reported_prompt_tokens / estimate * REFIT_MARGIN)
