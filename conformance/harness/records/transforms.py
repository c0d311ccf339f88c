"""What a kernel did under each transform its adapter asks of it (forward-mode AD, a double backward, forward-mode
AD of the backward, vmap, fake tensors, vmap of the backward), in words: the summary's line per adapter and the
certificate's section read it from one table.

The table is transform -> {dtype: (outcome, detail)}, outcome "answered" (the kernel gave an answer, which
its TRANSFORM-* clause judged) or "refused" (it raised what a framework raises for a transform it has no
rule for; ``detail`` says what), as the guarded call recorded them (``harness.calls.guarded``). A refusal
is a measured capability, like an invalid input refused: never a failure, never silent.
"""

from __future__ import annotations

from conformance.contract import DTYPES, TRANSFORMS

WORDS = {
    "jvp": "forward AD",
    "vjp_vjp": "double backward",
    "jvp_vjp": "forward AD of the backward",
    "vmap": "vmap",
    "fake": "fake tensors",
    "vmap_vjp": "vmap of the backward",
}
CLAUSES = {
    "jvp": "TRANSFORM-JVP-01 and COVER-PAIRS-01",
    "vjp_vjp": "TRANSFORM-GRADGRAD-03",
    "jvp_vjp": "TRANSFORM-FWD-OVER-REV-02",
    "vmap": "TRANSFORM-VMAP-04 and COVER-PAIRS-01",
    "fake": "TRANSFORM-FAKE-05",
    "vmap_vjp": "TRANSFORM-BATCHED-GRAD-06 and COVER-PAIRS-GRAD-02",
}


def table_of(records: list[dict]) -> dict[str, dict[str, dict]]:
    """transform -> dtype -> {"outcome", "detail"}, in TRANSFORMS and DTYPES order; the first record of a
    (transform, dtype) is kept, a later one that differs is noted in its detail."""
    out: dict[str, dict[str, dict]] = {}
    for rec in records:
        per = out.setdefault(rec["transform"], {})
        first = per.get(rec["dtype"])
        if first is None:
            per[rec["dtype"]] = {"outcome": rec["outcome"], "detail": rec["detail"]}
        elif first["outcome"] != rec["outcome"] and "; another call " not in first["detail"]:
            first["detail"] += f"; another call {rec['outcome']}" + (f" ({rec['detail']})" if rec["detail"] else "")
    return {
        t: {d: out[t][d] for d in sorted(out[t], key=lambda d: DTYPES.index(d) if d in DTYPES else len(DTYPES))}
        for t in TRANSFORMS
        if t in out
    }


def _phrase(transform: str, per_dtype: dict[str, dict]) -> str:
    outcomes = {r["outcome"] for r in per_dtype.values()}
    name = WORDS.get(transform, transform)
    if outcomes == {"answered"}:
        return f"{name} answered (judged by {CLAUSES.get(transform, 'its clause')})"
    refused = [(d, r["detail"]) for d, r in per_dtype.items() if r["outcome"] == "refused"]
    details = sorted({detail for _, detail in refused})
    where = "" if outcomes == {"refused"} else f" in {', '.join(d for d, _ in refused)}"
    return f"{name} refused{where} ({'; '.join(details)})"


def headline(by_transform: dict[str, dict[str, dict]]) -> str:
    """ "forward AD refused (NotImplementedError: ...), double backward answered (...), vmap answered (...)" """
    return ", ".join(_phrase(t, per) for t, per in by_transform.items())


def line(spec: str, by_transform: dict[str, dict[str, dict]]) -> list[str]:
    """The summary's line for one adapter (nothing when no transform was asked of its kernel)."""
    return [f"{spec}: transforms: {headline(by_transform)}"] if by_transform else []


def markdown(by_transform: dict[str, dict[str, dict]]) -> list[str]:
    """The certificate's section: one row per transform and dtype."""
    out = [
        "\n## Transforms (forward AD, double backward, forward AD of the backward, vmap, fake tensors, vmap of the "
        "backward)\n",
        headline(by_transform) + ".\n",
        "| transform | dtype | outcome | detail |\n|---|---|---|---|",
    ]
    for t, per in by_transform.items():
        for d, r in per.items():
            detail = str(r["detail"]).replace("|", "\\|")
            out.append(f"| {WORDS.get(t, t)} | {d} | {r['outcome']} | {detail} |")
    return out
