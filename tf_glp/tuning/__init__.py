"""tf_glp's start-up tuning kit: what the choices made at the start of a fit
share. Today the plan store (store.py: one cache per user and machine); the
choices themselves still live beside their strategies (strategy/
update_choice.py, strategy/execution_choice.py, strategy/
one_device_strategy.py)."""
