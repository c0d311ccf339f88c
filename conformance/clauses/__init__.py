"""The clauses: one module per spec section, each clause a test naming its id and source sentence.

Each clause is an ordinary function ``test_...(impl, ...)`` so that pytest collects it, the plugin
parametrises it per adapter and dtype, and the self-tests can call it directly on a mutant kernel.
"""
