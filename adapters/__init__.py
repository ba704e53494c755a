"""fencekeeper.adapters: everything that touches the world (files, stores, the command line).

The modules a deployment uses (each with ``__all__`` and a docstring on every
public name):

- :mod:`~fencekeeper.adapters.client` and :mod:`~fencekeeper.adapters.aio`:
  the client ``fencekeeper.connect`` returns, and its asyncio form;
- :mod:`~fencekeeper.adapters.errors`: the client's exception families;
- :mod:`~fencekeeper.adapters.ports`: the ``AuthorityPolicy`` and
  ``CommandHandler`` a deployment implements;
- :mod:`~fencekeeper.adapters.service`: the operations, one store
  transaction each, that the client calls;
- :mod:`~fencekeeper.adapters.worker`: the dispatcher loop;
- :mod:`~fencekeeper.adapters.store` and
  :mod:`~fencekeeper.adapters.connect`: the store port, and opening a store
  from a URL;
- :mod:`~fencekeeper.adapters.observe`: JSON logs, metrics, spans;
- :mod:`~fencekeeper.adapters.examples`: the example grants and handler
  (examples, not a deployment's authority);
- :mod:`~fencekeeper.adapters.testing`: the store test suite any store can run.

The rest (the stores' SQL, the codec, rendering, the command line, the demo)
serves these and may change between versions.  Nothing is imported here, so
importing one module loads only what it needs.
"""
