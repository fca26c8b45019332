"""robotrl.datasets: the zarr episode store, recorders, samplers for training, and LeRobot / MCAP interop."""

from robotrl.datasets.store import (
    CorruptChunkError,
    Episode,
    EpisodeStore,
    EpisodeWriter,
    StoreError,
    VectorRecorder,
    validate,
)

__all__ = ["CorruptChunkError", "Episode", "EpisodeStore", "EpisodeWriter", "StoreError", "VectorRecorder", "validate"]
