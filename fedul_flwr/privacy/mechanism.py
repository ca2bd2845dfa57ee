"""The parts of the Gaussian mechanism every DP mode shares: the modes of
``differential-privacy``, the flat clip of an update (:func:`clip_update`), Gaussian noise
(:func:`add_noise`) drawn from a generator of its own per release (:func:`release_generator`).
The overview is :mod:`fedul_flwr.privacy`.
"""

from __future__ import annotations

import secrets

import numpy as np
from flwr.supercore.differential_privacy import get_norm

from fedul_flwr.config import CHOICES

__all__ = ["ACCOUNTED_MODES", "DP_MODES", "SERVER_MODES", "NonFiniteUpdateError", "add_noise", "clip_update", "release_generator"]

DP_MODES: tuple[str, ...] = CHOICES["differential-privacy"]
"""Values of ``differential-privacy``: none, server-fixed, server-adaptive, client-local."""
SERVER_MODES: tuple[str, ...] = ("server-fixed", "server-adaptive")
"""Values of ``differential-privacy`` whose noise the server adds (Flower's DP strategy wrappers)."""
ACCOUNTED_MODES: tuple[str, ...] = (*SERVER_MODES, "client-local")
"""Values of ``differential-privacy`` whose (epsilon, delta) a run records."""
_ENTROPY_BITS = 256  # from the OS CSPRNG, seed of one release's generator


def release_generator() -> np.random.Generator:
    """A fresh generator for one release's noise: numpy's ``Generator`` on ``PCG64``, seeded with
    256 bits of the operating system's CSPRNG (:func:`secrets.randbits`, i.e. ``os.urandom``).

    No state is shared with numpy's global generator or with any other release, and nothing the
    run keeps (its ``seed``, records, folder) can regenerate the draws. PCG64 itself is not a
    cryptographic generator: its 256-bit seed, drawn per release and never stored, is what no
    one can know.
    """
    return np.random.Generator(np.random.PCG64(secrets.randbits(_ENTROPY_BITS)))


def add_noise(arrays: list[np.ndarray], std: float, generator: np.random.Generator) -> list[np.ndarray]:
    """``arrays`` plus i.i.d. Gaussian noise N(0, std^2) per coordinate, each array in its own dtype.

    Parameters
    ----------
    arrays : list[np.ndarray]
        Any shapes (float arrays; an integer array gets the noise rounded away by the cast, as
        Flower's ``add_gaussian_noise_inplace`` does).
    std : float
        Standard deviation (>= 0), in the arrays' units.
    generator : np.random.Generator
        Where the noise comes from (:func:`release_generator`).

    Returns
    -------
    list[np.ndarray]
        New arrays; ``arrays`` are left as they are.
    """
    return [a + generator.normal(0.0, std, a.shape).astype(a.dtype) for a in arrays]


def clip_update(update: list[np.ndarray], clipping_norm: float) -> tuple[list[np.ndarray], bool]:
    """An update scaled to L2 norm at most C (the flat clip of McMahan et al., ICLR 2018):
    Delta min(1, C / ||Delta||), the norm taken over every array together (Flower's ``get_norm``).

    A zero update stays zero (Flower's clipping divides by its norm).

    Parameters
    ----------
    update : list[np.ndarray]
        The update's arrays, finite (:class:`NonFiniteUpdateError` otherwise).
    clipping_norm : float
        C > 0, in the update's units.

    Returns
    -------
    (list[np.ndarray], bool)
        The clipped arrays (new ones, same dtypes) and whether they were scaled down.

    Raises
    ------
    NonFiniteUpdateError
        If an array holds NaN or an infinity: there is no norm to clip to.
    """
    bad = sum(int(np.size(a) - np.count_nonzero(np.isfinite(a))) for a in update)
    if bad:
        total = sum(int(np.size(a)) for a in update)
        raise NonFiniteUpdateError(f"the update holds {bad} non-finite values (NaN or inf) of {total}: no norm to clip to")
    norm = get_norm([np.asarray(a, dtype=np.float64) for a in update])
    if norm <= clipping_norm:
        return [np.array(a, copy=True) for a in update], False
    scale = clipping_norm / norm
    return [(np.asarray(a, dtype=np.float64) * scale).astype(np.asarray(a).dtype) for a in update], True


class NonFiniteUpdateError(ValueError):
    """A reply's model update holds NaN or an infinity (:func:`clip_update`); under DP the
    reply counts as a failed one of its node."""
