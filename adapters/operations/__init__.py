"""Durable operations (seed 001): the store port and its stores, the service, the worker and examples.

``fencekeeper.adapters.operations.service`` is the Python API users start
from; ``ports`` is what a store implements.
"""
