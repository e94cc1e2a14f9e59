"""The `celosia` command line."""
import sys
def main(argv=None):
    print("celosia: CLI under construction", file=sys.stderr)
    return 1
