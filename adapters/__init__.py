"""fencekeeper.adapters: everything that touches the world (files, stores, the command line)."""
