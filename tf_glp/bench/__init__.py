"""`python -m tf_glp.bench compare`: distributed-training concepts side by
side on the user's machine (see compare.py)."""
