"""The one boundary between tf_glp and Keras' and TensorFlow's internals:
compat.py reads and calls them, patches.py wraps Keras' methods;
tests/test_keras_boundary.py keeps them out of the rest of tf_glp."""
