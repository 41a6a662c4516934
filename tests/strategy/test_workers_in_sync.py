"""The checksum behind the workers-in-sync check (tf_glp/strategy/workers_in_sync.py);
the check itself runs across workers in test_multi_worker_configurations.py."""

import numpy as np
import pytest
import tensorflow as tf

from tf_glp.strategy.workers_in_sync import checksum


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_one_ulp_anywhere_changes_the_checksum(dtype):
    values = tf.cast(tf.reshape(tf.range(-6.0, 6.0) / 7.0, [3, 4]), dtype)
    reference = int(checksum(values))
    assert int(checksum(tf.identity(values))) == reference  # the same bits: the same sum
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.size]
    raw = values.numpy().view(bits)
    for index in range(raw.size):
        changed = raw.copy().reshape(-1)
        changed[index] += 1  # the next representable value
        assert int(checksum(tf.constant(changed.view(values.numpy().dtype).reshape(3, 4)))) != reference, index


def test_signed_zeros_and_integers():
    # Bitwise equality is what the workers promise: -0.0 is not 0.0.
    assert int(checksum(tf.constant([0.0]))) != int(checksum(tf.constant([-0.0])))
    assert int(checksum(tf.constant([3, 4], tf.int64))) == 7
    assert int(checksum(tf.constant([True, False, True]))) == 2
    assert checksum(tf.zeros([0])).dtype == tf.int64
