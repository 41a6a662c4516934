"""`python -m tf_glp.plan show PLAN.json`: the plan's command line at
its documented name. The module is tf_glp.profiling.plan; importing
tf_glp.plan gives that same module."""

import sys

from tf_glp.profiling import plan as _plan

if __name__ == "__main__":
    sys.exit(_plan.main())
sys.modules[__name__] = _plan
