"""NEFTune (Jain et al. 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning", arXiv:2310.05914):
uniform noise of scale alpha / sqrt(L d) added to the input embeddings while training. Trainer attaches its
embedding hook in its own loop, which fedhf replaces, so this round hook attaches it for the run and removes it
at the end (``neftune_noise_alpha``; nothing when it is unset)."""

from __future__ import annotations

from typing import Optional

from transformers.integrations.neftune import activate_neftune, deactivate_neftune

from .base import RoundHook


class NEFTune(RoundHook):
    def __init__(self, alpha: Optional[float]) -> None:
        self.alpha, self.handle = alpha, None

    def on_train_begin(self, trainer, run) -> None:
        if self.alpha:
            self.handle = activate_neftune(trainer.model, self.alpha)

    def on_train_end(self, trainer, run) -> None:
        if self.handle is not None:
            deactivate_neftune(trainer.model, self.handle)
            self.handle = None
