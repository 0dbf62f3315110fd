"""Tracker and framework adapters, installed as ``neuraldbg_track.integrations``.

Each adapter imports its tracker lazily and is an optional extra, so the core needs only torch.
"""
