"""The language-neutral conformance suite: case files, the driver protocol, the runner.

- :mod:`.cases` generates specs/conformance/*.json from the kernel;
- :mod:`.driver` is the Python implementation's driver (the kernel, and any
  store through :mod:`.store_driver`);
- :mod:`.runner` starts a driver, sends it the cases and reports per layer.

The protocol is specs/conformance.md; how to use it is docs/conformance.md.
"""
