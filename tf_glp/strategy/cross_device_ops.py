"""HostCrossDeviceOps: replicas' values summed on the host CPU by the native
host_reduce, chunk by chunk, then sent where TensorFlow asks."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence

import tensorflow as tf

from tf_glp.ops import host_reduce
from tf_glp.ops._common import FLOAT_DTYPES
from tf_glp.strategy import compression as compression_lib


def local_components(value) -> list[tf.Tensor]:
    """The per-replica tensors of a distributed value. For a sparse one
    (IndexedSlices), its rows: they stand in for it in chunk sizes and
    barriers, and are never densified (see concat_on_host)."""
    parts = value.values if isinstance(value, tf.distribute.DistributedValues) else [value]
    return [part.values if isinstance(part, tf.IndexedSlices) else part for part in parts]


def is_sparse(value) -> bool:
    """Whether a (distributed) gradient is an IndexedSlices (e.g. Embedding's)."""
    parts = value.values if isinstance(value, tf.distribute.DistributedValues) else [value]
    return any(isinstance(part, tf.IndexedSlices) for part in parts)


def concat_on_host(value, reduce_op, host_device: str) -> tf.IndexedSlices:
    """The replicas' IndexedSlices of a (distributed) value as one, on the
    host: their rows concatenated in replica order (values divided by N for
    a mean), as TensorFlow's ReductionToOneDevice does.

    Kept sparse, not summed into a dense tensor: Keras 3's optimizers treat an
    IndexedSlices gradient slice by slice (Adam squares each slice before
    duplicates are added), so densifying would change what the model learns
    compared with one device and with MirroredStrategy.
    """
    parts = value.values if isinstance(value, tf.distribute.DistributedValues) else [value]
    with tf.device(host_device):
        slices = [p if isinstance(p, tf.IndexedSlices) else tf.IndexedSlices(
            tf.reshape(p, [-1, *p.shape[1:]]), tf.range(tf.shape(p)[0]), tf.shape(p, out_type=tf.int64))
            for p in parts]
        values = tf.concat([tf.identity(s.values) for s in slices], axis=0)
        indices = tf.concat([tf.cast(s.indices, tf.int64) for s in slices], axis=0)
        if reduce_op == tf.distribute.ReduceOp.MEAN:
            values = values / tf.cast(len(slices), values.dtype)
        return tf.IndexedSlices(values, indices, slices[0].dense_shape)


def byte_sizes(parts_per_value: Sequence[Sequence[tf.Tensor]]) -> list[int]:
    """Bytes of each value (its first replica's tensor), for chunk plans."""
    return [int(parts[0].shape.num_elements() or 0) * parts[0].dtype.size for parts in parts_per_value]


def reduce_on_host(parts: Sequence[tf.Tensor], reduce_op: tf.distribute.ReduceOp, out_dtype: tf.DType,
                   host_device: str) -> tf.Tensor:
    """Sum or mean of `parts` on the host: native host_reduce for float
    types (float32 accumulation), tf.add_n for any other dtype."""
    op = "mean" if reduce_op == tf.distribute.ReduceOp.MEAN else "sum"
    with tf.device(host_device):
        if parts[0].dtype in FLOAT_DTYPES:
            return tf.cast(host_reduce(parts, op=op, output_dtype=tf.float32), out_dtype)
        total = tf.add_n(list(parts))
        return _divide(total, len(parts), host_device) if op == "mean" else total


class HostCrossDeviceOps(tf.distribute.CrossDeviceOps):
    """Cross-device reductions done by the host CPUs.

    Each value's replicas are summed by `tf_glp.ops.host_reduce` on the host
    device and the result is broadcast to the destinations. Values are
    grouped into chunks (see chunking.py): a chunk's reductions start once all
    of that chunk's inputs exist, and depend on nothing else, so TensorFlow
    can run them while other gradients are still being computed.

    Args:
        host_device: Where reductions run (default: "/cpu:0").
        compression: None or a scheme of compression.py ("bf16", "fp16"):
            float32 gradients (reductions inside `reducing_gradients()`)
            cross to the host compressed and are accumulated in float32
            (default: None, no compression).
        chunk_plan: Called with the values' sizes in bytes, returns chunks of
            indices (default: every value its own chunk).

    Example:
        >>> strategy = tf.distribute.MirroredStrategy(
        ...     ["/cpu:0", "/cpu:1"], cross_device_ops=HostCrossDeviceOps())
    """

    def __init__(self, host_device: str = "/cpu:0", compression: str | None = None,
                 chunk_plan: Callable[[list[int]], list[list[int]]] | None = None):
        super().__init__()
        self.host_device = host_device
        self.scheme = compression_lib.get(compression)  # (ValueError naming the known schemes)
        self.chunk_plan = chunk_plan
        # Sums a chunk's host results across the workers, one collective per
        # chunk (span_workers).
        self.across_workers: Callable[[list], list] | None = None
        self._gradient_scopes = 0
        self._lock = threading.Lock()

    def span_workers(self, host_device: str, across_workers: Callable[[list], list]) -> None:
        """Makes the reductions hierarchical (multi_worker_strategy.py): this worker's
        host (`host_device`, in full) sums its replicas, then
        `across_workers` sums the hosts' results (it has `num_workers`)."""
        if self.across_workers is not None:
            raise ValueError("HostCrossDeviceOps.span_workers: already spans workers")
        self.host_device = host_device
        self.across_workers = across_workers

    @property
    def _num_between_graph_workers(self) -> int:
        # CrossDeviceOps shortcuts single-value reductions when this is 1.
        return self.across_workers.num_workers if self.across_workers else 1

    @contextlib.contextmanager
    def reducing_gradients(self):
        """Marks the reductions made inside as gradient sums: only those are
        compressed; metrics, losses and everything else stay exact.

        A count, not a thread-local: tf.distribute builds each replica's step
        in its own thread and runs the merge (where reductions happen) in
        another. Merges happen only when every replica has reached the same
        merge_call, so a gradient merge sees every replica inside this scope
        and any other merge sees none. (Two models tracing steps on one
        strategy at the same time, in different threads, would share the
        count: one strategy per concurrently trained model.)
        """
        with self._lock:
            self._gradient_scopes += 1
        try:
            yield
        finally:
            with self._lock:
                self._gradient_scopes -= 1
    def in_chunks(self, parts: Sequence[Sequence[tf.Tensor]], sizes: Sequence[int] | None = None):
        """Yields the chunks of these values' indices (see chunking.py), each
        with its barrier (see the class docstring) in place while the
        caller's loop body runs; one value: no barrier. `sizes` (bytes)
        defaults to the parts' own."""
        sizes = byte_sizes(parts) if sizes is None else sizes
        chunks = self.chunk_plan(sizes) if self.chunk_plan else [[i] for i in range(len(parts))]
        for chunk in chunks:
            barrier = [t for i in chunk for t in parts[i]] if len(chunk) > 1 else []
            with tf.control_dependencies(barrier):
                yield chunk

    def reduce_to_host(self, values: Sequence, reduce_op=tf.distribute.ReduceOp.SUM, *, gradients: bool = False,
                       overflow: str = "raise") -> list:
        """Each value's replicas reduced on the host (across workers too), as
        host tensors; sparse values stay IndexedSlices (concat_on_host) and
        None stays None. `gradients=True` applies `compression`."""
        present = [i for i, value in enumerate(values) if value is not None]
        parts = [local_components(values[i]) for i in present]
        sparse = {k for k, i in enumerate(present) if is_sparse(values[i])}
        scheme = self.scheme if gradients or self._gradient_scopes else None
        # Across workers, each worker sums its own replicas and the workers'
        # sums are added: a mean divides once, by every replica of the cluster.
        local_op = tf.distribute.ReduceOp.SUM if self.across_workers else reduce_op
        results: list = [None] * len(values)
        for chunk in self.in_chunks(parts):
            reduced = {}
            for k in chunk:
                if k in sparse:
                    reduced[k] = concat_on_host(values[present[k]], local_op, self.host_device)
                else:
                    wire = compression_lib.for_host(parts[k], scheme, self.host_device, overflow=overflow)
                    reduced[k] = reduce_on_host(wire, local_op, parts[k][0].dtype, self.host_device)
            if self.across_workers:
                reduced = dict(zip(chunk, self.across_workers([reduced[k] for k in chunk])))
                if reduce_op == tf.distribute.ReduceOp.MEAN:
                    reduced = {k: _divide(r, len(parts[k]) * self.across_workers.num_workers, self.host_device)
                               for k, r in reduced.items()}
            for k in chunk:
                results[present[k]] = reduced[k]
        return results

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self.batch_reduce_implementation(reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        reduced = self.reduce_to_host([value for value, _ in value_destination_pairs], reduce_op)
        return [self.broadcast(r, destination) for r, (_, destination) in zip(reduced, value_destination_pairs)]


def _divide(value, count: int, device: str):
    with tf.device(device):
        if isinstance(value, tf.IndexedSlices):
            return tf.IndexedSlices(value.values / tf.cast(count, value.values.dtype), value.indices,
                                    value.dense_shape)
        return value / tf.cast(count, value.dtype)
