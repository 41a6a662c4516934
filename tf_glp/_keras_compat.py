"""Every reach of tf_glp into private Keras or TensorFlow internals, in one place.

Written for Keras 3.15 and TensorFlow 2.21 (WRITTEN_FOR; pyproject.toml pins
both). Each class-level internal is listed in INTERNALS with what tf_glp uses
it for; `missing_internals()` names those the installed versions lack.
tests/test_keras_compat.py fails loudly on any of them, and on the
instance-level ones (an optimizer's slot lists) built from real Keras
objects; `require_internals()`, called when the first tf_glp.Strategy is
created, raises instead of letting tf_glp run half-patched.

Not here: host_extended.py and multi_worker.py subclass TensorFlow's private
strategy extended classes (ParameterServerStrategyExtended, MirroredExtended,
CollectiveAllReduceExtended); the methods they override or borrow are listed
in INTERNALS too, and tests/strategy/test_real_models.py and
tests/strategy/test_multi_worker.py check their behaviour.
"""

from __future__ import annotations

import importlib

WRITTEN_FOR = {"keras": "3.15", "tensorflow": "2.21"}

# (module, class, attribute): what tf_glp uses it for.
INTERNALS = {
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_backend_update_step"):
        "patched: the fused host update (hooks.py)",
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_apply_weight_decay"):
        "patched: skipped when the fused update applies weight decay",
    ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_backend_apply_gradients"):
        "patched: gradient accumulation and EMA overwrites (apply_gradients.py)",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_apply_weight_decay"):
        "weight decay on one copy of the variables (apply_gradients.py)",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_clip_gradients"): "clipping accumulated gradients",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_get_variable_index"): "a variable's slot index",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_use_weight_decay"): "which variables decay",
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "_update_model_variables_moving_average"):
        "the EMA update after an accumulated step",
    ("keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer", "_tf_apply"):
        "patched: loss scaling inside the host update (loss_scaling.py)",
    ("keras.src.trainers.trainer", "Trainer", "compile"): "patched: jit_compile checks",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "fit"):
        "patched: batch-size check and the chunking decision",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "make_train_function"):
        "one confirming retrace (chunking_decision.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended",
     "_create_variable"): "host variables (host_extended.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_create_variable"):
        "replicated variables (host_extended.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_update"):
        "per-copy updates (host_extended.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_get_variable_creator_initial_value"):
        "initial values of replica copies (host_extended.py)",
    ("tensorflow.python.distribute.distribute_lib", "UpdateContext", "__enter__"):
        "writes to one copy of a replicated slot (apply_gradients.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended", "_update"):
        "overridden: host or per-copy updates (host_extended.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended", "_reduce_to"):
        "overridden (host_extended.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended",
     "_validate_colocate_with_variable"): "overridden (host_extended.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended", "read_var"):
        "overridden (host_extended.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended",
     "value_container"): "overridden (host_extended.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_initialize_local_devices"): "overridden: tf_glp's replicas on each worker (multi_worker.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_get_variable_creator_initial_value"): "overridden: initial values checked, then the chief's (multi_worker.py)",
    ("tensorflow.python.distribute.collective_all_reduce_strategy", "CollectiveAllReduceExtended",
     "_gather_to_implementation"): "overridden: gathers stay TensorFlow's (multi_worker.py)",
    ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended", "_broadcast_to"):
        "overridden: host variables as destinations (multi_worker.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended",
     "_create_var_creator"): "borrowed: host variables across workers (multi_worker.py)",
    ("tensorflow.python.distribute.parameter_server_strategy", "ParameterServerStrategyExtended",
     "_select_single_value"): "borrowed: host updates across workers (multi_worker.py)",
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "_maybe_symbolic_build"):
        "its multi-worker bug is worked around in MultiWorker*Strategy.reduce (strategy.py)",
    ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "_should_save_on_batch"):
        "subclassed: tf_glp.callbacks.BackupAndRestore",
    ("tensorflow.python.distribute.ps_values", "AggregatingVariable", "get"):
        "a host variable's one copy (apply_gradients.py)",
}

# Instance attributes, checked on real objects by tests/test_keras_compat.py:
# an optimizer's slot lists (adam_slots, accumulator, ema_averages,
# built_variables, step_counter) and a built Conv2D / Dense layer's `_kernel`
# and `_build_shapes_dict`, which tf_glp.layers shares between a layer and
# its twin (convert, strip).


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


def keras_class(module_name: str, class_name: str):
    """A Keras / TensorFlow class named in INTERNALS (for patching)."""
    return getattr(importlib.import_module(module_name), class_name)


# -- optimizer internals ------------------------------------------------------
def variable_index(optimizer, variable) -> int:
    return optimizer._get_variable_index(variable)  # noqa: SLF001


def uses_weight_decay(optimizer, variable) -> bool:
    return optimizer._use_weight_decay(variable)  # noqa: SLF001


def adam_slots(optimizer, index: int):
    """(first moment, second moment) of an Adam / AdamW variable."""
    return optimizer._momentums[index], optimizer._velocities[index]  # noqa: SLF001


def accumulator(optimizer, variable):
    """The gradient accumulator of `variable` (gradient_accumulation_steps)."""
    return optimizer._accumulated_gradients[variable_index(optimizer, variable)]  # noqa: SLF001


def step_counter(optimizer):
    """The optimizer's own step count (not divided by accumulation steps)."""
    return optimizer._iterations  # noqa: SLF001


def built_variables(optimizer) -> list:
    """The trainable variables the optimizer was built with."""
    return optimizer._trainable_variables  # noqa: SLF001


def ema_averages(optimizer) -> list:
    return optimizer._model_variables_moving_average  # noqa: SLF001


def clip_gradients(optimizer, grads):
    return optimizer._clip_gradients(grads)  # noqa: SLF001


def apply_weight_decay(optimizer, variables) -> None:
    """Keras' TensorFlow weight decay (a merge in replica context)."""
    optimizer._apply_weight_decay(variables)  # noqa: SLF001


def apply_weight_decay_to_copy(optimizer, variables) -> None:
    """Keras' backend-neutral weight decay: plain assigns on these variables."""
    keras_class("keras.src.optimizers.base_optimizer", "BaseOptimizer")._apply_weight_decay(optimizer, variables)  # noqa: SLF001


def update_step(optimizer, grads, variables) -> None:
    """Keras' update of `variables` (a merge in replica context)."""
    optimizer._backend_update_step(grads, variables, optimizer.learning_rate)  # noqa: SLF001


def update_ema(optimizer) -> None:
    optimizer._update_model_variables_moving_average(built_variables(optimizer))  # noqa: SLF001


def update_context(replica_or_device):
    """TensorFlow's UpdateContext: writes to replicated variables inside go
    to the copy of this replica (an int) or device (a string)."""
    from tensorflow.python.distribute import distribute_lib  # noqa: PLC0415

    return distribute_lib.UpdateContext(replica_or_device)


# -- data and strategies --------------------------------------------------------
def dataset_batch_size(dataset) -> int | None:
    """The static batch size of a batched tf.data.Dataset, if it has one."""
    spec = dataset.element_spec
    first = spec
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


def set_cross_device_ops(extended, cross_device_ops) -> None:
    """CentralStorageStrategy has no public way to set its cross-device ops."""
    extended._cross_device_ops = cross_device_ops  # noqa: SLF001


def in_xla_context() -> bool:
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.python.ops import control_flow_util  # noqa: PLC0415

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
