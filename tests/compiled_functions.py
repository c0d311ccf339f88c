"""Plain functions with torch SDPA's signature that torch.compile wraps, as a user brings them to the suite.

``compiled_sdpa`` is torch's SDPA compiled with static shapes, one program per input structure::

    pytest conformance/clauses --impl=tests.compiled_functions:compiled_sdpa --declare compiles_per_shape=true

(or ``--discover``, which measures ``compiles_per_shape``). The suite calls it with dynamo's recompile
limits raised (``implementations/function.py``), so every structure is compiled, none run eagerly.
"""

import torch
import torch.nn.functional as F

compiled_sdpa = torch.compile(F.scaled_dot_product_attention, dynamic=False)
