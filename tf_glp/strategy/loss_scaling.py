"""The end of a loss-scaled step under update="host", as Keras 3.15's
LossScaleOptimizer does it (`_stateful_handle_finite_grads` /
`_stateful_handle_non_finite_grads`), from cross-replica context.

HostStrategy._apply_loss_scaled_update sums and unscales the gradients on the
host and checks them in the same pass; this module applies the outcome:
finite: the inner optimizer's step (its fused host update), then the scale
doubles after `dynamic_growth_steps` good steps in a row; not finite: no
step, the scale halves and the count restarts.
"""

from __future__ import annotations

import tensorflow as tf


def finish_step(loss_scale_optimizer, step_is_finite: tf.Tensor, unscaled_grads: list, variables: list) -> None:
    lso = loss_scale_optimizer

    def apply_step():
        lso.inner_optimizer.apply(unscaled_grads, trainable_variables=variables)

        def upscale():
            lso.step_counter.assign(0)
            lso.dynamic_scale.assign(lso.dynamic_scale * 2.0)

        def increment():
            lso.step_counter.assign_add(1)

        tf.cond(tf.equal(lso.step_counter, lso.dynamic_growth_steps - 1), upscale, increment)

    def skip_step():
        lso.step_counter.assign(0)
        lso.dynamic_scale.assign(lso.dynamic_scale * 0.5)

    tf.cond(step_is_finite, apply_step, skip_step)
