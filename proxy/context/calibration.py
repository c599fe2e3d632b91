"""How far our token estimate is from the upstream's count, learned from what it reports.

Pure arithmetic: the shell feeds it the upstream's prompt tokens and our estimate per turn.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

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
# What the upstream bills for a sealed blob (Responses' `encrypted_content`) per token our estimate gives it, learned
# apart from the ratio. One ratio learned on requests whose edits left mostly sealed reasoning scaled the client's
# whole request by the blobs' error: Codex's at 200k were counted 1.3x what the upstream billed, and edits priced
# on the rest. Each turn says prompt = a x (the rest of our count) + b x (the sealed estimate); least squares over
# the recent turns (each weighing SEALED_MEMORY of the one after it) gives the scale b / a (a is the ratio's part),
# believed once the two counts have varied apart (edits change their mix) and within bounds.
SEALED_MEMORY = 0.8
SEALED_MIN_SPREAD = 0.01  # 1 - their squared correlation over the turns: below it, the two counts say nothing apart
SEALED_BOUNDS = (0.1, 4.0)  # from an upstream that bills nothing for a blob to one that bills its base64 as text


class Calibration:
    """Per model name, upstream prompt tokens per token we estimated (1.0 until learned)."""

    def __init__(self, start: float = 1.0) -> None:
        self.start = start  # the ratio assumed before anything is learned (> 1: a margin for a foreign tokenizer)
        self.ratios: OrderedDict[str, float] = OrderedDict()
        self.scales: OrderedDict[str, float] = OrderedDict()  # per model, `sealed_scale` once learned
        self._fits: OrderedDict[str, SealedFit] = OrderedDict()

    def ratio(self, model: str, start: float | None = None) -> float:
        return self.ratios.get(model, self.start if start is None else start)

    def correction(self, model: str, floor: float = 0.0, start: float | None = None) -> float:
        """The model's learned ratio (`start` until one is learned), never below what a retry taught (`floor`)."""
        return max(self.ratio(model, start), floor)

    def sealed_scale(self, model: str) -> float:
        """Upstream tokens per token we estimate in a sealed blob (1.0 until learned)."""
        return self.scales.get(model, 1.0)

    def learn(self, model: str, prompt_tokens: int, estimate: float, sealed: tuple[int, int] = (0, 0)) -> None:
        """One billed request: the upstream's count, ours (`estimate`) and of it, `sealed`: what its sealed parts
        were counted at and their estimate before the scale (`dialects.base.sealed_parts`)."""
        observed = observed_ratio(prompt_tokens, estimate)
        if observed is None:
            return
        old = self.ratios.pop(model, observed)
        self.ratios[model] = old + RATIO_SMOOTHING * (observed - old)
        _bound(self.ratios)
        counted, unscaled = sealed
        if unscaled <= 0:
            return
        fit = self._fits.pop(model, None) or SealedFit()
        self._fits[model] = fit
        _bound(self._fits)
        if (scale := fit.add(estimate - counted, unscaled, prompt_tokens)) is not None:
            self.scales.pop(model, None)
            self.scales[model] = scale
            _bound(self.scales)


class SealedFit:
    """prompt = a x rest + b x sealed, by least squares over the turns seen, the older weighing less."""

    __slots__ = ("rp", "rr", "rs", "sp", "ss")

    def __init__(self) -> None:
        self.rr = self.rs = self.ss = self.rp = self.sp = 0.0

    def add(self, rest: float, sealed: float, prompt: float) -> float | None:
        """Add one turn; the scale b / a, or None while the turns cannot tell the two apart."""
        m = SEALED_MEMORY
        self.rr, self.rs, self.ss = m * self.rr + rest * rest, m * self.rs + rest * sealed, m * self.ss + sealed**2
        self.rp, self.sp = m * self.rp + rest * prompt, m * self.sp + sealed * prompt
        det = self.rr * self.ss - self.rs * self.rs
        if det <= SEALED_MIN_SPREAD * self.rr * self.ss:
            return None
        a = (self.rp * self.ss - self.rs * self.sp) / det
        b = (self.rr * self.sp - self.rs * self.rp) / det
        if a <= 0:
            return None
        return min(SEALED_BOUNDS[1], max(SEALED_BOUNDS[0], b / a))


def _bound(learned: OrderedDict[str, Any]) -> None:
    while len(learned) > MAX_MODELS_LEARNED:
        learned.popitem(last=False)


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
