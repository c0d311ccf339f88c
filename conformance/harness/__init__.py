"""The harness: everything between a clause and an adapter.

Floors (imports point down only): contract <- oracle <- harness <- clauses. Adapters import the
contract alone. Submodules are small and named for what they hold; importing this package imports
none of them, because the pytest plugin is loaded on every pytest start.
"""
