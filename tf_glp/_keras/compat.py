"""What tf_glp reads, calls or subclasses of Keras' and TensorFlow's private internals.

The boundary's reading half (tf_glp/_keras/__init__.py): nothing outside this
package imports a private module or touches a private attribute.

Written for Keras 3.15 and TensorFlow 2.21 (WRITTEN_FOR; pyproject.toml pins
both). Each class-level internal is listed in INTERNALS with what tf_glp uses
it for; `missing_internals()` names those the installed versions lack.
tests/test_keras_compat.py fails loudly on any of them, and on the
instance-level ones (an optimizer's slot lists, and the instance attributes
the accessors below read or set) built from real Keras objects; the
multi-worker ones are checked by tests/strategy/test_multi_worker*.py.
`require_internals()` (patches.install() calls it) raises instead of
letting tf_glp run half-patched.

host_strategy.py, multi_worker_strategy.py and one_device_strategy.py
(with host_copies.py's HostUpdateExtended mixin) subclass TensorFlow's
private strategy extended classes, which they get from here
(mirrored_extended_class, ...) with the state they read and the helpers
they call; the private methods they override are listed in INTERNALS (the
boundary test requires it), and tests/strategy/ checks their behaviour.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

WRITTEN_FOR = {"keras": "3.15", "tensorflow": "2.21"}

# (module, class, attribute): what tf_glp uses it for.
INTERNALS = {
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "apply"):
        "patched: the optimizer step taken out of the replicas' step (patches.py, Strategy._apply_once)",
    ("tensorflow._api.v2.__internal__.distribute", "interim", "maybe_merge_call"):
        "patched: Keras' optimizer helpers called directly in tf_glp's cross-replica step (patches.py)",
    ("keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer", "_tf_apply"):
        "patched: the loss-scaled step taken out of the replicas' step (patches.py)",
    ("keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer", "_common_apply"):
        "the loss-scaled step in cross-replica context (apply_loss_scaled)",
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_backend_update_step"):
        "patched: the fused host update (patches.py)",
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_apply_weight_decay"):
        "patched: skipped when the fused update applies weight decay",
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_var_key"):
        "a host copy finds its slots through its container (host_copies.py)",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_apply_weight_decay"):
        "weight decay on the host copy of a sparse-gradient variable (fused_host_step.py)",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_get_variable_index"): "a variable's slot index",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_use_weight_decay"): "which variables decay",
    ("keras.src.trainers.trainer", "Trainer", "compile"): "patched: jit_compile checks",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "fit"):
        "patched: batch-size check and the chunking decision",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "make_train_function"):
        "one confirming retrace (chunking_decision.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_create_variable"):
        "overridden: optimizer variables on the host (host_copies.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_update"):
        "overridden: updates of trainable variables on their host copies (host_copies.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_validate_colocate_with_variable"):
        "overridden: slots colocated with a host copy (host_copies.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "read_var"):
        "overridden: reads of host variables (host_copies.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_local_results"):
        "the results of a host update (host_copies.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_initialize_local_devices"): "overridden: tf_glp's replicas on each worker (multi_worker_strategy.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_get_variable_creator_initial_value"):
        "overridden: initial values checked, then the chief's (multi_worker_strategy.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_gather_to_implementation"): "overridden: gathers stay TensorFlow's (multi_worker_strategy.py)",
    ("tensorflow.python.distribute", "distribute_lib", "_get_default_strategy"):
        "whether a model trains without a strategy (is_default_strategy)",
    ("tensorflow.python.framework", "config", "is_op_determinism_enabled"):
        "whether op determinism is on (op_determinism_enabled)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_in_multi_worker_mode"): "whether a strategy spans workers (in_multi_worker_mode)",
    ("tensorflow.python.distribute.cross_device_ops", "CrossDeviceOps", "_gather"):
        "gathers across workers stay TensorFlow's (gather)",
    ("keras.src.trainers.trainer", "Trainer", "_symbolic_build"):
        "the model and its compiled loss and metrics built as fit builds them, before update='auto' "
        "measures (symbolic_build)",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "_maybe_symbolic_build"):
        "patched: skipped once nothing is left to build (nothing_to_build); its multi-worker bug is worked "
        "around in MultiWorkerKerasFixes.reduce (multi_worker_strategy.py)",
    ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "_should_save_on_batch"):
        "subclassed: calls _save_model every save_freq batches (tf_glp.callbacks.BackupAndRestore)",
    ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "_save_model"):
        "overridden: chief-only, atomic backups with batch-level metadata (tf_glp.callbacks.BackupAndRestore)",
    ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "_load_model"):
        "Keras' own restore, for its backups (load_keras_backup)",
    ("tensorflow.python.distribute.cross_device_ops", "CrossDeviceOps", "_num_between_graph_workers"):
        "overridden: the worker count of tf_glp's hierarchical reductions (cross_device_ops.py)",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "train_step"):
        "patched: one pass per micro-batch (micro_batches.py)",
    ("keras.src.trainers.trainer", "Trainer", "_compute_loss"): "a micro-batch's loss (compute_loss)",
    ("keras.src.losses", "loss", "scale_loss_for_distribution"): "patched: 1/M per micro-batch (micro_batches.py)",
    ("keras.src.losses", "loss", "unscale_loss_for_distribution"): "patched: the same, undone for the logs",
    ("keras.src.layers.layer", "Layer", "_flatten_layers"): "a model's layers, nested ones included (all_layers)",
    ("keras.src.random.seed_generator", "SeedGenerator", "next"):
        "patched: one random stream per micro-batch (micro_batches.py)",
    ("keras.src.layers.normalization.batch_normalization", "BatchNormalization", "_moments"):
        "patched: each micro-batch's moments recorded (micro_batches.py)",
    ("keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer", "apply"):
        "patched: an optimizer met unbuilt in the replicas' step is built outside the trace (patches.py)",
    ("tensorflow.python.distribute.one_device_strategy", "OneDeviceExtended", "_experimental_distribute_dataset"):
        "overridden: a one-device tf_glp.Strategy leaves datasets as plain Keras iterates them "
        "(one_device_strategy.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_experimental_distribute_dataset"):
        "overridden: one CPU replica's datasets left as plain Keras iterates them (host_strategy.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_get_cross_device_ops"): "which collective reduces a value (reduces_on_host)",
    ("tensorflow.python.distribute", "distribute_utils", "is_sync_on_read"): "host homes skip sync-on-read variables",
    ("tensorflow.python.distribute", "distribute_utils", "select_replica"): "one replica's arguments (host_copies.py)",
    ("tensorflow.python.distribute", "values", "DistributedVariable"): "is_distributed_variable",
    ("tensorflow.python.distribute", "values", "PerReplica"): "micro-batch gradients handed over unsummed",
    ("tensorflow.python.ops", "collective_ops", "all_reduce_v2"):
        "integers checked across workers (multi_worker_strategy.py)",
    ("tensorflow.python.distribute", "multi_worker_util", "coordination_leader"):
        "the coordination service as MultiWorkerMirroredStrategy configures it (cluster.py)",
    ("tensorflow.python.eager", "context", "Context"): "configure_coordination_service",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceStrategy",
     "_collective_key_base"): "collective keys of its own for each multi-worker strategy (set_collective_key_base)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_enable_check_health"): "a later strategy reuses this process's server (reuse_collective_server)",
}


def missing_internals() -> list[str]:
    """The INTERNALS the installed Keras / TensorFlow lack, with their use."""
    missing = []
    for (module_name, class_name, attribute), use in INTERNALS.items():
        try:
            owner = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{class_name} ({use})")
            continue
        if not hasattr(owner, attribute):
            missing.append(f"{module_name}.{class_name}.{attribute} ({use})")
    return missing


def require_internals() -> None:
    """Raises RuntimeError, naming what changed, if an internal is missing."""
    missing = missing_internals()
    if missing:
        import keras  # noqa: PLC0415
        import tensorflow as tf  # noqa: PLC0415

        raise RuntimeError(
            f"tf_glp was written for Keras {WRITTEN_FOR['keras']} and TensorFlow {WRITTEN_FOR['tensorflow']}; "
            f"the installed Keras {keras.__version__} / TensorFlow {tf.__version__} lack: " + "; ".join(missing)
            + ". Install the versions pyproject.toml pins.")


def internal(module_name: str, name: str):
    """`name` (a class, function or submodule) of the Keras / TensorFlow
    module `module_name`, imported when called: an internal named in
    INTERNALS (missing_internals() names it if it is gone)."""
    return getattr(importlib.import_module(module_name), name)


# -- trainer internals (micro-batches) ------------------------------------------
def compute_loss(model, x, y, y_pred, sample_weight):
    """The loss Keras' train_step computes (scaled for distribution)."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,  # noqa: SLF001
                               training=True)


def loss_tracker(model):
    """The metric behind the logged "loss"."""
    return model._loss_tracker  # noqa: SLF001


def call_has_training_arg(model) -> bool:
    return model._call_has_training_arg  # noqa: SLF001


def all_layers(model) -> list:
    """Every layer inside `model`, nested ones included."""
    return list(model._flatten_layers(include_self=False, recursive=True))  # noqa: SLF001


def nothing_to_build(model) -> bool:
    """Whether Keras' symbolic build would build nothing: every layer, the
    compiled metrics and loss, and the optimizer built (the checks of
    Trainer._symbolic_build, whose last step, _post_build, does nothing in
    the TensorFlow backend)."""
    metrics, loss = model._compile_metrics, model._compile_loss  # noqa: SLF001
    return (all(layer.built for layer in all_layers(model)) and (metrics is None or metrics.built)
            and (loss is None or loss.built) and (model.optimizer is None or model.optimizer.built))


# -- optimizer internals ------------------------------------------------------
def variable_index(optimizer, variable) -> int:
    return optimizer._get_variable_index(variable)  # noqa: SLF001


def uses_weight_decay(optimizer, variable) -> bool:
    return optimizer._use_weight_decay(variable)  # noqa: SLF001


def optimizer_slot(optimizer, attribute: str, index: int):
    """The slot variable of the optimizer's variable `index` in its list
    `attribute` (e.g. "_momentums"; tf_glp.ops.keras_fused names them per
    class)."""
    return getattr(optimizer, attribute)[index]


def learning_rate_is_callable(optimizer) -> bool:
    """Whether the optimizer's learning rate is a schedule or a function (as
    Adafactor's update_step tests it), not a number or variable."""
    return callable(optimizer._learning_rate)  # noqa: SLF001


def nadam_u_product(optimizer):
    """Nadam's running product of its momentum schedule."""
    return optimizer._u_product  # noqa: SLF001


def built_variables(optimizer) -> list:
    """The trainable variables the optimizer was built with, as a list
    (Keras keeps whatever sequence `build` received: a tuple when the user
    passed `apply_gradients(zip(...))`), a wrapper's (LossScaleOptimizer's)
    inner optimizer's after its own, each variable once."""
    found: list = []
    seen: set[int] = set()
    while optimizer is not None:
        for variable in optimizer._trainable_variables:  # noqa: SLF001
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return found


def apply_weight_decay_to_copy(optimizer, variables) -> None:
    """Keras' backend-neutral weight decay: plain assigns on these variables."""
    base_optimizer = internal("keras.src.optimizers.base_optimizer", "BaseOptimizer")
    base_optimizer._apply_weight_decay(optimizer, variables)  # noqa: SLF001


def creating_optimizer_variable() -> bool:
    """Whether a variable created now is a Keras optimizer's: created inside
    `backend.name_scope(optimizer.name, caller=optimizer)` (iterations,
    learning rate, slots, EMA averages, accumulators, loss-scale state) or
    by a method of an optimizer (Nadam's and Adafactor's `build` create
    some variables outside any name scope when Keras' trainer builds the
    optimizer directly)."""
    import sys  # noqa: PLC0415

    from keras.src.backend.common import global_state  # noqa: PLC0415
    from keras.src.optimizers.base_optimizer import BaseOptimizer  # noqa: PLC0415

    stack = global_state.get_global_attribute("name_scope_stack") or []
    if any(isinstance(getattr(entry, "caller", None), BaseOptimizer) for entry in stack):
        return True
    frame = sys._getframe(1)  # noqa: SLF001
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), BaseOptimizer):
            return True
        frame = frame.f_back
    return False


def keras_variable_value(variable):
    """The tf.Variable inside a Keras variable (a tf.Variable as it is)."""
    return getattr(variable, "_value", variable)


def set_keras_variable_value(variable, value) -> None:
    """Points a Keras variable at another tf.Variable (update="host" points
    the optimizer's variables at their host copies during its step)."""
    variable._value = value  # noqa: SLF001


def set_distributed_container(variable, container) -> None:
    """Makes `container` (a mirrored variable) the distributed container of
    `variable`, as TensorFlow does for the mirrored variable's own copies:
    Keras' TFOptimizer._var_key then maps the variable to the container's
    slots."""
    import weakref  # noqa: PLC0415

    variable._distributed_container = weakref.ref(container)  # noqa: SLF001


def apply_loss_scaled(loss_scale_optimizer, grads, variables) -> None:
    """LossScaleOptimizer's step from cross-replica context: its
    backend-neutral apply (finite check, inner step or skip, scale update)."""
    loss_scale_optimizer._common_apply(grads, trainable_variables=variables)  # noqa: SLF001


def is_default_strategy(strategy) -> bool:
    """Whether `strategy` is TensorFlow's default one (no tf.distribute)."""
    return strategy is internal("tensorflow.python.distribute.distribute_lib", "_get_default_strategy")()


def in_multi_worker_mode(strategy) -> bool:
    return strategy.extended._in_multi_worker_mode()  # noqa: SLF001


def gather(cross_device_ops, value, destinations, axis, options):
    """TensorFlow's gather through a CrossDeviceOps (no public entry)."""
    return cross_device_ops._gather(value, destinations=destinations, axis=axis, options=options)  # noqa: SLF001


def set_initial_epoch(model, epoch: int) -> None:
    """Where fit starts (what Keras' own BackupAndRestore sets)."""
    model._initial_epoch = epoch  # noqa: SLF001


def load_keras_backup(callback) -> None:
    """Keras' own BackupAndRestore restore, for a subclass that overrides it."""
    internal("keras.src.callbacks.backup_and_restore", "BackupAndRestore")._load_model(callback)  # noqa: SLF001


def share_kernel(twin, layer) -> None:
    """Makes a built Conv2D / Dense `layer`'s kernel `twin`'s too, tracked
    as build() would track it (tf_glp.layers convert and strip)."""
    twin._kernel = layer._kernel  # noqa: SLF001
    twin._build_shapes_dict = layer._build_shapes_dict  # noqa: SLF001


def last_batch_seen(callback) -> int:
    """The last batch a Keras BackupAndRestore saw in this epoch."""
    return callback._last_batch_seen  # noqa: SLF001


def tensorboard_profiles(callback) -> bool:
    """Whether a keras.callbacks.TensorBoard profiles batches (its
    profile_batch, kept only in private fields)."""
    return callback._should_trace  # noqa: SLF001


# -- data and strategies --------------------------------------------------------
def symbolic_build(model, data_batch) -> None:
    """Builds the model, its compiled metrics and loss and its optimizer as
    fit does before its first step (from one batch's shapes)."""
    model._symbolic_build(data_batch=data_batch)  # noqa: SLF001


def dataset_batch_size(dataset) -> int | None:
    """The static batch size of a batched tf.data.Dataset, if it has one."""
    first = dataset.element_spec
    while isinstance(first, (tuple, list)):
        first = first[0] if first else None
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    shape = getattr(first, "shape", None)
    if shape is not None and shape.rank and shape[0] is not None:
        return int(shape[0])
    size = getattr(dataset, "_batch_size", None)  # BatchDataset keeps it even with a partial last batch
    try:
        return int(size) if size is not None else None
    except TypeError:
        return None


def op_determinism_enabled() -> bool:
    """Whether tf.config.experimental.enable_op_determinism() was called
    (TensorFlow has no public getter)."""
    return internal("tensorflow.python.framework.config", "is_op_determinism_enabled")()


def in_xla_context() -> bool:
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.python.ops import control_flow_util  # noqa: PLC0415

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


# -- tf.distribute's private classes and state ----------------------------------
def mirrored_extended_class():
    """MirroredStrategy's extended object (host_strategy.HostMirroredExtended)."""
    return internal("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended")


def one_device_extended_class():
    """OneDeviceStrategy's extended object (one_device_strategy.OneDeviceExtended)."""
    return internal("tensorflow.python.distribute.one_device_strategy", "OneDeviceExtended")


def collective_extended_class():
    """MultiWorkerMirroredStrategy's extended object (multi_worker_strategy.py)."""
    return internal("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended")


def per_replica_class():
    """tf.distribute's PerReplica values (micro_batches.MicroBatchGradients)."""
    return internal("tensorflow.python.distribute.values", "PerReplica")


def is_distributed_variable(value) -> bool:
    """Whether `value` is a tf.distribute variable (mirrored, sync-on-read, ...)."""
    return isinstance(value, internal("tensorflow.python.distribute.values", "DistributedVariable"))


def is_sync_on_read(variable) -> bool:
    return internal("tensorflow.python.distribute.distribute_utils", "is_sync_on_read")(variable)


def select_replica(index: int, structure):
    """Replica `index`'s element of every per-replica value in `structure`."""
    return internal("tensorflow.python.distribute.distribute_utils", "select_replica")(index, structure)


class CollectiveWorker(NamedTuple):
    """What a multi-worker extended object knows about its cluster."""

    num_workers: int
    worker_device: str
    id_in_cluster: int
    is_chief: bool


def collective_worker(extended) -> CollectiveWorker:
    """The cluster facts of a CollectiveAllReduceExtended."""
    return CollectiveWorker(extended._num_workers, extended._worker_device,  # noqa: SLF001
                            extended._id_in_cluster, extended._is_chief)  # noqa: SLF001


def set_collective_key_base(strategy, base: int) -> None:
    """Where a MultiWorkerMirroredStrategy's collective group and instance
    keys start (read by its extended object's constructor)."""
    strategy._collective_key_base = base  # noqa: SLF001


def reuse_collective_server(extended) -> None:
    """Makes a CollectiveAllReduceExtended about to be constructed use the
    gRPC server and coordination service this process already runs (an
    earlier strategy's) instead of enabling collective ops again, which
    restarts the collective executor while the other workers may be in a
    collective; its health check stays off, as the coordination service's
    heartbeat does that job (as it did for the earlier strategy)."""
    extended._std_server_started = True  # noqa: SLF001 (an instance attribute only: TensorFlow reads it by getattr)
    extended._enable_check_health = False  # noqa: SLF001


def replace_cross_device_ops(extended, cross_device_ops):
    """Makes `cross_device_ops` the reductions of a CollectiveAllReduceExtended;
    returns (its collective ops over the local devices, its collective ops
    over this worker's host), both TensorFlow's."""
    local = extended._cross_device_ops  # noqa: SLF001
    extended._cross_device_ops = cross_device_ops  # noqa: SLF001
    return local, extended._host_cross_device_ops  # noqa: SLF001


def reduces_on_host(extended, value) -> bool:
    """Whether a CollectiveAllReduceExtended reduces `value` with its host
    collective (a host value) rather than its local devices' one."""
    return extended._get_cross_device_ops(value) is not extended._cross_device_ops  # noqa: SLF001


def collective_initial_value(extended, **kwargs):
    """CollectiveAllReduceExtended's initial-value function (the chief's
    value, broadcast), for an extended object that overrides it."""
    return collective_extended_class()._get_variable_creator_initial_value(extended, **kwargs)  # noqa: SLF001


def all_reduce_among_workers(extended, values, device: str, merge_op: str, timeout_s: float | None = None):
    """One CollectiveReduceV2 of `values` (int64, on `device`) over the
    workers of a CollectiveAllReduceExtended, with its group keys; eager."""
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.python.ops import collective_ops  # noqa: PLC0415

    keys = extended._collective_keys  # noqa: SLF001
    group_key = keys.get_group_key([device])
    instance_key = keys.get_instance_key(group_key, device)
    with tf.device(device):
        return collective_ops.all_reduce_v2(tf.constant(values, tf.int64), extended._num_workers,  # noqa: SLF001
                                            group_key, instance_key, merge_op=merge_op, final_op="Id",
                                            timeout=timeout_s or 0).numpy().tolist()


def normalized_cluster_spec(cluster_resolver):
    """The resolver's cluster spec as tf.distribute normalises it."""
    normalize = internal("tensorflow.python.distribute.multi_worker_util", "normalize_cluster_spec")
    return normalize(cluster_resolver.cluster_spec())


def coordination_leader(cluster_resolver) -> str:
    """The task that runs the coordination service, as MultiWorkerMirroredStrategy
    picks it ("/job:chief/replica:0/task:0", else the first worker)."""
    leader = internal("tensorflow.python.distribute.multi_worker_util", "coordination_leader")
    return leader(normalized_cluster_spec(cluster_resolver))


def configure_coordination_service(cluster_resolver, register_ms: int, heartbeat_ms: int) -> None:
    """The coordination service as MultiWorkerMirroredStrategy configures
    it, with `register_ms` as its register timeout and `heartbeat_ms` as its
    heartbeat and shutdown timeouts; nothing if this process already has one."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2  # noqa: PLC0415
    from tensorflow.python.distribute import multi_worker_util  # noqa: PLC0415
    from tensorflow.python.eager import context  # noqa: PLC0415

    if context.context().coordination_service is not None:
        return
    cluster_spec = normalized_cluster_spec(cluster_resolver)
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        cluster_register_timeout_in_ms=register_ms,
        heartbeat_timeout_in_ms=heartbeat_ms,
        shutdown_barrier_timeout_in_ms=heartbeat_ms,
    )
