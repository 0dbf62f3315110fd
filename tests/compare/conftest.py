import pytest

from tests.compare.runs import saturating_run


@pytest.fixture(scope="session")
def journals(tmp_path_factory):
    """``{"early": run_dir, "late": run_dir}``: the two runs of tests/compare/runs.py, journal only."""
    root = tmp_path_factory.mktemp("compare-journals")
    return {name: saturating_run(root / name, name).journal.run_dir for name in ("early", "late")}
