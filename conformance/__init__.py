"""sdpa-conformance: a spec-driven conformance suite for scaled dot-product attention kernels.

Importing this package must stay cheap: the pytest plugin is loaded for every pytest run in an
environment where the distribution is installed, so nothing heavy (torch, jax) is imported here.
"""

__version__ = "0.1.0"
SPEC_REVISION = "seeds-2026-11 (000_f3dcd408372d9e02.txt, 003_648455d5abd16778.txt)"
