"""perf: the performance profile of 003 (latency after warm-up, peak memory, which backend ran).

The fixed grid of prefill and decode rows, the measuring worker process and how it is launched,
timing, peak memory, the two-GEMM floor, memory scaling, the spot check of a profiled row's
output, and the profile's charts and summary (``report``, ``charts``, ``svg``). The pytest side
(options, the BACKEND-01 / MEM-SCALING-01 plumbing) is ``run.perf``; the certificate's HTML
section is ``records.perf_html``.

May import: judge, calls, cases, spec, the oracle and the contract.
"""
