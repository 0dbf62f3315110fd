"""Hydra search-path plugin (installed as ``hydra_plugins.neuraldbg_track``).

Hydra imports every module under ``hydra_plugins`` at start-up; this one adds our packaged presets
(``pkg://neuraldbg_track.conf``) to every Hydra app and registers the schema, so a user's config only
needs ``- neuraldbg: default`` in its defaults list.
"""
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class NeuralDbgSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        import neuraldbg_track.hydra_conf  # noqa: F401  registers neuraldbg/schema in the ConfigStore

        search_path.append(provider="neuraldbg-track", path="pkg://neuraldbg_track.conf")
