import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    """Journals default to ./neuraldbg: keep every test's files in its own tmp dir."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEURALDBG_DIR", raising=False)
    torch.manual_seed(0)
    yield
