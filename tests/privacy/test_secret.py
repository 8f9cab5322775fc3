"""The run's privacy secret comes from the operating system's entropy, not from the seed (unless asked, for tests)."""

from __future__ import annotations

from fedhf.privacy.secret import SECRET_BITS, draw_secret


def test_a_secret_is_fresh_per_draw_and_independent_of_the_seed():
    draws = {draw_secret(False, seed=0) for _ in range(8)}
    assert len(draws) == 8 and 0 not in draws  # 63 random bits: a repeat has probability ~ 8^2 / 2^64
    assert all(0 <= d < 2 ** SECRET_BITS for d in draws)


def test_reproducible_noise_uses_the_seed():
    assert draw_secret(True, seed=1234) == draw_secret(True, seed=1234) == 1234
