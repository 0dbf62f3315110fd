"""Hydra presets for neuraldbg-track (installed as ``neuraldbg_track.conf``); see hydra_conf.py."""
