import pytest

from tests.clause_runner import load_clauses

load_clauses()


@pytest.fixture
def restore_hypothesis_profile():
    """In-process pytester runs load hypothesis profiles globally; give the outer session its own back."""
    from conformance.harness.cases import strategies

    saved = strategies.profile_name()
    yield
    strategies.load_profile(saved)
