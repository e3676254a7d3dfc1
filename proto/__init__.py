"""The wire contract: generated stubs for the public router API and the internal store-node API.

Regenerate with ``python -m proto.generate``; a unit test fails when they are stale.
"""
