"""judge: is a kernel's answer right? The error model and every comparison made with it.

``expected`` is the oracle's answer for a case with its allowance, ``tolerance`` the first-order
error model, ``ensemble`` the spread of valid same-precision formulations, ``compare`` the
comparisons clauses make (forward, weights, gradients), and the judges of special answers: the
log-sum-exp, the variants' forward (visible keys and output) and gradients, dropout's gradients,
and a rejection of an invalid input.

May import: calls (a comparison calls the kernel through the guarded adapter), cases, spec,
the oracle and the contract.
"""
