"""Hypothesis strategies and profiles.

Two profiles: ``ci`` (derandomized, so every run of the same command sees the same examples and a
failure reproduces with the command printed beside it) and ``thorough`` (random seeds, many more
examples). Example counts are set per clause with :func:`examples`, sized for the clause's power
rather than by habit; the profile multiplies them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

_PROFILE = {"name": "ci"}
PREFIX = "sdpa-conformance-"  # hypothesis has a built-in "ci" profile; ours must not replace it
_MULTIPLIER = {"ci": 1, "thorough": 10}


def register_profiles() -> None:
    common = dict(
        deadline=None,
        print_blob=True,
        # no "explain" phase: its line-coverage notes point into the suite, not into the kernel
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.differing_executors,
            HealthCheck.function_scoped_fixture,
            HealthCheck.filter_too_much,
        ],
    )
    settings.register_profile(PREFIX + "ci", derandomize=True, database=None, **common)
    settings.register_profile(PREFIX + "thorough", derandomize=False, **common)


def load_profile(name: str) -> None:
    register_profiles()
    settings.load_profile(PREFIX + name)
    _PROFILE["name"] = name


def examples(ci: int) -> settings:
    """Settings for a clause whose ci profile needs ``ci`` examples (thorough: 10x).

    The parent is named explicitly: other libraries imported during collection (torch's test
    utilities, for one) load hypothesis profiles of their own, and a clause must not inherit theirs.
    """
    register_profiles()
    parent = settings.get_profile(PREFIX + _PROFILE["name"])
    return settings(parent=parent, max_examples=ci * _MULTIPLIER.get(_PROFILE["name"], 1))


@dataclass(frozen=True)
class Shape:
    B: int
    Hq: int
    Hkv: int
    T: int
    S: int
    Dk: int
    Dv: int


@st.composite
def shapes(
    draw,
    *,
    gqa: bool = True,
    max_len: int = 17,
    dims: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 16, 24, 32),
    square_dims: bool = False,
) -> Shape:
    """Small attention shapes, T != S and Dk != Dv included; shrinks towards 1s."""
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3)) if gqa else 1
    T = draw(st.integers(1, max_len))
    S = draw(st.integers(1, max_len))
    Dk = draw(st.sampled_from(dims))
    Dv = Dk if square_dims else draw(st.sampled_from(dims))
    return Shape(B, Hkv * group, Hkv, T, S, Dk, Dv)


seeds = st.integers(0, 2**31 - 1)
