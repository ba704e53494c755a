"""``python -m fencekeeper``: the ``fencekeeper`` command line."""

from fencekeeper.adapters.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
