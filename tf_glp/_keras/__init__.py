"""The boundary between tf_glp and Keras' and TensorFlow's internals.

Everything tf_glp reaches in private Keras or TensorFlow modules and
attributes lives in this package, and only here:

- compat.py: what tf_glp reads or calls (each listed in INTERNALS with what
  it is used for, checked against the installed versions at start-up);
- patches.py: the methods of Keras that tf_glp wraps, installed once.

The rest of tf_glp (strategy/, profiling/, callbacks/, layers/, ops/) uses
public TensorFlow/Keras APIs and this package; tests/test_keras_boundary.py
reads tf_glp's source and fails, naming file and line, on any private
import or private attribute of a TensorFlow/Keras object outside it.
"""
