"""The run's privacy secret: the one number the Gaussian noise, the distributed-DP shares and secure aggregation's
pair masks and rounding are derived from.

Differential privacy holds only if nobody who sees the release can regenerate the noise. fedhf's ``seed`` is
printed on the model card and decides the data split and the sampled cohorts, so the noise must not follow from
it: the secret is drawn from the operating system's entropy (:mod:`secrets`, the source Google's DP libraries
and Opacus' ``secure_mode`` draw from) when the run starts, independently of ``seed`` and ``data_seed``. It is
kept only in the server's round checkpoint (so a killed and resumed run is still bit-identical) and never written
to the model, its card or the history.

``dp_reproducible_noise=True`` (tests and debugging only; it voids the guarantee) makes the secret the run's
``seed``, so two runs with one seed draw the same noise.
"""

from __future__ import annotations

import secrets

SECRET_BITS = 63  # fits an int64 tensor in the checkpoint and numpy's SeedSequence


def draw_secret(reproducible: bool, seed: int) -> int:
    """A fresh 63-bit secret from the operating system's entropy; the run's ``seed`` when ``reproducible``."""
    if reproducible:
        return int(seed)
    return secrets.randbits(SECRET_BITS)
