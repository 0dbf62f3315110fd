import os
import sys

import pytest


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One sqlite MLflow store for the framework tests (creating one migrates it: seconds)."""
    import mlflow

    root = tmp_path_factory.mktemp("fw-mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # the Default experiment's artifact root is ./mlruns at creation time
        mlflow.MlflowClient(uri).search_experiments()
    return uri


@pytest.fixture(autouse=True)
def _restore_tracker_globals():
    """Lightning's MLFlowLogger and the HF MLflowCallback set MLflow's process-wide tracking URI and
    experiment (and the environment variables mirroring them): undo that for the tests that follow."""
    environ = dict(os.environ)
    before = _mlflow_globals()
    yield
    os.environ.clear()
    os.environ.update(environ)
    if "mlflow" in sys.modules:
        from mlflow.tracking import fluent
        from mlflow.tracking._tracking_service import utils

        while fluent.active_run() is not None:
            fluent.end_run()
        utils._tracking_uri, fluent._active_experiment_id = before


def _mlflow_globals() -> tuple:
    if "mlflow" not in sys.modules:
        return None, None
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    return utils._tracking_uri, fluent._active_experiment_id
