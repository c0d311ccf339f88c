"""Draw the import layers as SVG: ``python scripts/architecture.py > docs/architecture.svg``.

Generated from the code, never drawn by hand: the layers are tests/layers.py's declaration (the same
one tests/test_layers.py checks), the boxes list the modules each room holds today, and every arrow
is a pair of rooms with at least one import between them. tests/test_layers.py checks that the
committed picture is what this script draws now (regenerate it when a module or a room-to-room
import appears or goes; a new import between rooms already connected changes nothing).
"""

from __future__ import annotations

import sys
from html import escape
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import layers

WIDTH = 1260
ROW_H = 20  # one line of module names
BOX_W = 760
LEFT = 40
ADAPTER_X = LEFT + BOX_W + 200
ADAPTER_W = 260


def _room(module: str) -> str:
    if module.split(".")[0] == layers.ADAPTERS:
        return layers.ADAPTERS
    return layers.entry_of(module) or module


def _label(entry: str) -> str:
    if entry == "conformance":
        return "conformance and conformance.harness (packages: version, no imports)"
    if entry == layers.ADAPTERS:
        return "implementations (adapters)"
    return entry.replace("conformance.harness.", "harness/").removeprefix("conformance.")


def _wrap(names: list[str], width: int) -> list[str]:
    lines, cur = [], ""
    for n in names:
        if cur and len(cur) + len(n) + 2 > width:
            lines.append(cur)
            cur = ""
        cur = f"{cur}, {n}" if cur else n
    return lines + ([cur] if cur else [])


def _box(x: float, y: float, w: float, title: str, names: list[str], fill: str) -> tuple[float, list[str]]:
    """A room: its name and its modules; returns (height, SVG elements)."""
    lines = _wrap(sorted(names), int(w / 7))
    h = ROW_H * (1 + len(lines)) + 8
    out = [f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" rx="6" fill="{fill}" stroke="#567"/>']
    out.append(f'<text x="{x + 8:.0f}" y="{y + 17:.0f}" font-weight="bold">{escape(title)}</text>')
    for j, line in enumerate(lines):
        ty = y + 17 + ROW_H * (j + 1)
        out.append(f'<text x="{x + 8:.0f}" y="{ty:.0f}" font-size="11" fill="#333">{escape(line)}</text>')
    return h, out


def _members(mods: dict[str, Path]) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for m, path in mods.items():
        room = _room(m)
        if path.name == "__init__.py" and m != room:
            continue  # a room's own docstring
        members.setdefault(room, []).append(path.name if m == room else m.rsplit(".", 1)[-1])
    return members


def draw() -> str:
    mods = layers.modules()
    found = layers.imports()
    members = _members(mods)
    edges = {(_room(i.importer), _room(i.imported)) for i in found} - {(r, r) for r in members}

    boxes: dict[str, tuple[float, float, float, float]] = {}
    parts: list[str] = []
    y = 60.0
    for floor in layers.LAYERS:
        for entry in (e for e in floor if e in members):  # independent rooms of one floor: one row each
            fill = "#eef3fb" if entry.startswith("conformance.harness") else "#f4f4f4"
            h, elems = _box(LEFT, y, BOX_W, _label(entry), members[entry], fill)
            boxes[entry] = (LEFT, y, BOX_W, h)
            parts += elems
            y += h + 18
    # the adapters stand beside the layers, level with the contract, the one thing they import
    _, cy, _, ch = boxes["conformance.contract"]
    ah = ROW_H * (1 + len(_wrap(sorted(members[layers.ADAPTERS]), int(ADAPTER_W / 7)))) + 8
    _, elems = _box(ADAPTER_X, cy + ch - ah, ADAPTER_W, _label(layers.ADAPTERS), members[layers.ADAPTERS], "#fbf3e8")
    boxes[layers.ADAPTERS] = (ADAPTER_X, cy + ch - ah, ADAPTER_W, ah)
    parts += elems

    order = {e: i for i, e in enumerate(boxes)}
    for a, b in sorted(edges, key=lambda e: (order[e[0]], order[e[1]])):
        ax, ay, aw, ah_ = boxes[a]
        bx, by, bw, bh = boxes[b]
        tip = f"<title>{escape(_label(a))} imports {escape(_label(b))}</title>"
        if layers.ADAPTERS in (a, b):  # a straight line between the column and the adapters' box
            x1, x2 = (ax + aw, bx) if b == layers.ADAPTERS else (ax, bx + bw)
            d = f"M{x1:.0f},{ay + ah_ / 2:.0f} L{x2:.0f},{by + bh / 2:.0f}"
            parts.append(f'<path d="{d}" stroke="#a86" fill="none" marker-end="url(#arr)">{tip}</path>')
            continue
        xm = LEFT + BOX_W + 12 + order[a] * 9  # one lane per importing room
        y1, y2 = ay + ah_ / 2, by + bh / 2
        d = f"M{ax + aw:.0f},{y1:.0f} L{xm:.0f},{y1:.0f} L{xm:.0f},{y2:.0f} L{bx + bw:.0f},{y2:.0f}"
        parts.append(
            f'<path d="{d}" stroke="#789" stroke-opacity="0.6" fill="none" marker-end="url(#arr)">{tip}</path>'
        )
    height = y + 20
    title = "sdpa-conformance: the import layers (imports point down only)"
    sub = (
        f"{len(mods)} modules; an arrow for each of the {len(edges)} pairs of rooms with an import between them; "
        "generated by scripts/architecture.py from tests/layers.py"
    )
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        'font-family="sans-serif" font-size="13">',
        '<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#678"/></marker></defs>',
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="white"/>',
        f'<text x="{LEFT}" y="30" font-size="16" font-weight="bold">{title}</text>',
        f'<text x="{LEFT}" y="48" font-size="11" fill="#555">{sub}</text>',
    ]
    return "\n".join(head + parts + ["</svg>"]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(draw())
