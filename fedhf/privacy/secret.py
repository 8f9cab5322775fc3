"""The run's privacy secret: the one number the sampled cohorts (under DP), the Gaussian noise and secure
aggregation's masks and rounding are derived from (each distributed-DP client draws its own share secret the same
way, kept in the client store).

Differential privacy holds only if nobody who sees the release can regenerate the noise, and its amplification by
sampling only if nobody can recompute the sample. fedhf's ``seed`` is printed on the model card and decides the
data split, so neither may follow from it: the secret is drawn from the operating system's entropy (:mod:`secrets`)
when the run starts, independently of ``seed`` and ``data_seed``. It is kept only in the server's round checkpoint
(so a killed and resumed run is still bit-identical) and never written to the model, its card or the history.

Only the 63-bit seed is cryptographic. The samples drawn from it come from non-cryptographic generators: torch's
Mersenne Twister (MT19937) for the noise, shares and masks, numpy's PCG64 for the cohorts. MT19937 is linear over
GF(2), so its state can in principle be reconstructed from enough partially known outputs; Opacus' ``secure_mode``
instead draws every sample from a CSPRNG. fedhf has no such mode (docs/privacy.md, "The generator").

``dp_reproducible_noise=True`` (tests and debugging only; it voids the guarantee) makes the secret the run's
``seed``, so two runs with one seed draw the same cohorts and noise.
"""

from __future__ import annotations

import secrets

SECRET_BITS = 63  # fits an int64 tensor in the checkpoint and numpy's SeedSequence


def draw_secret(reproducible: bool, seed: int) -> int:
    """A fresh 63-bit secret from the operating system's entropy; the run's ``seed`` when ``reproducible``."""
    if reproducible:
        return int(seed)
    return secrets.randbits(SECRET_BITS)
