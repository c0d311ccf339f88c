"""Hypothesis profiles and per-clause example counts.

Two profiles: ``ci`` (derandomized, so every run of the same command sees the same examples and a
failure reproduces with the command printed beside it) and ``thorough`` (random seeds, many more
examples). Example counts are set per clause with :func:`examples`, sized for the clause's power
rather than by habit; the profile multiplies them. The loaded profile also picks the drawn space
(``harness.cases.space``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

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


def profile_name() -> str:
    """The loaded profile's name: ``ci`` unless ``--conformance-profile`` (or a self-test) chose another."""
    return _PROFILE["name"]


def examples(ci: int) -> settings:
    """Settings for a clause whose ci profile needs ``ci`` examples (thorough: 10x).

    The parent is named explicitly: other libraries imported during collection (torch's test
    utilities, for one) load hypothesis profiles of their own, and a clause must not inherit theirs.
    """
    register_profiles()
    parent = settings.get_profile(PREFIX + _PROFILE["name"])
    return settings(parent=parent, max_examples=ci * _MULTIPLIER.get(_PROFILE["name"], 1))
