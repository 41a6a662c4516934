"""Limits of the native core that Python checks against (pure Python: the
planning code reads them without loading TensorFlow)."""

MAX_CONCURRENCY = 64  # core::kMaxLanes in cc/core/lane_pool.h
