"""python -m tf_glp.bench compare [...]"""

import sys

from tf_glp.bench import compare

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "compare":
        print("usage: python -m tf_glp.bench compare [--help]", file=sys.stderr)
        sys.exit(2)
    sys.exit(compare.main(sys.argv[2:]))
