"""One run of every scenario per test session, shared by the quality and reasoner tests."""
from __future__ import annotations

import pytest

from neuraldbg_track.scenarios import SCENARIOS, ScenarioRun, run_scenario


@pytest.fixture(scope="session")
def suite_runs() -> dict[str, ScenarioRun]:
    """Every scenario trained once with the default thresholds (about 10 s on one CPU core)."""
    return {name: run_scenario(scenario) for name, scenario in SCENARIOS.items()}


from tests.integrations.conftest import mlflow_store  # noqa: F401  (one sqlite store per session)
