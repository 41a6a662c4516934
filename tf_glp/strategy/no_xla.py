"""Why tf_glp.Strategy with replicas refuses XLA, said once.

Its host aggregation and update are native host ops, which XLA cannot
compile: compile's jit_compile="auto" becomes False, jit_compile=True is
refused when the model is compiled, and an optimizer step that still finds
itself inside an XLA context (a user's own jit-compiled function) stops with
the same message. (A one-device tf_glp.Strategy leaves an explicit
jit_compile alone, Keras' own update running under it; otherwise it
measures XLA and uses it only with allow_xla=True: execution_choice.py.)
"""

from __future__ import annotations

import warnings

from tf_glp._keras import compat

MESSAGE = ("tf_glp.Strategy does not support jit_compile=True: its host aggregation runs as native host ops "
           "outside XLA. Compile the model with jit_compile=False (or leave the default).")


def prepare_compile(arguments: dict, allow_xla: bool = False) -> None:
    """compile's arguments (bound to Keras' compile signature), in place;
    `allow_xla` (the strategy's setting) is said to have no effect."""
    if allow_xla:
        warnings.warn("tf_glp.Strategy(allow_xla=True) has no effect with replicas: XLA is chosen on one device "
                      "only (with replicas the host aggregation runs as native host ops outside XLA)", stacklevel=4)
    if arguments.get("jit_compile", "auto") is True:
        raise ValueError(MESSAGE)
    arguments["jit_compile"] = False


def check_not_in_xla() -> None:
    """Raises ValueError(MESSAGE) when called while XLA compiles."""
    if compat.in_xla_context():
        raise ValueError(MESSAGE)
