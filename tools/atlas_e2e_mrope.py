"""M-RoPE with image and video positions: HF's rotary class and apply function on 3-D
position ids whose (t, h, w) differ, against posenc's encoding on the same coordinates.

With text positions (t = h = w) M-RoPE is plain RoPE, so the text comparison of
tools/atlas_cases.py cannot tell whether posenc lays out the sections as the model does
(consecutive or interleaved, over the whole head or a part of it).
"""

from __future__ import annotations

import torch

HEADS = 2


def grid_positions():
    """(3, 48) position ids as Qwen2-VL's ``get_rope_index`` makes them: 6 text tokens, a
    4 x 4 image at t = 6, a 2-frame 2 x 4 video (t = 10, 11), then 10 text tokens."""
    t, h, w = [], [], []
    for i in range(6):
        t.append(i), h.append(i), w.append(i)
    for r in range(4):
        for c in range(4):
            t.append(6), h.append(6 + r), w.append(6 + c)
    for f in range(2):
        for r in range(2):
            for c in range(4):
                t.append(10 + f), h.append(10 + r), w.append(10 + c)
    start = max(max(t), max(h), max(w)) + 1
    for i in range(10):
        t.append(start + i), h.append(start + i), w.append(start + i)
    return torch.tensor([t, h, w])


def is_mrope(rot):
    """Whether HF's rotary class reads three position axes (its cos/sin change with h, w)."""
    pos = grid_positions()[:, None]  # (3, 1, S)
    x = torch.zeros(1, pos.shape[-1], 8)
    try:
        grid = rot(x, pos)
        text = rot(x, pos[:1].expand(3, -1, -1))
    except Exception:
        return False
    grid, text = (t if torch.is_tensor(t) else t[0] for t in (grid, text))
    # a 1-axis class reads the 3 axes as a batch of 3; M-RoPE's gives one row per sequence
    return grid.shape[0] == 1 and not torch.equal(grid, text)


def compare_grid(rot, apply, config, enc, call, width, hf_rotate, score_error, tolerance):
    """``{"status", "error", "reason"}`` of posenc's ``enc`` (built by ``call``) against HF
    on image and video positions, and of ``MRoPE.from_hf`` where ``enc`` is not one."""
    from posenc.torch import MRoPE

    pos = grid_positions()  # (3, S)
    seq = pos.shape[-1]
    cos_sin = rot(torch.zeros(1, seq, 8), pos[:, None])
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, HEADS, seq, width, generator=g)
    k = torch.randn(1, 1, seq, width, generator=g)
    want_q, want_k = hf_rotate(apply, q, k, cos_sin)
    tol = tolerance(int(pos.max()))
    out = {}
    builds = ((call, lambda: enc), ("MRoPE.from_hf(config)", lambda: MRoPE.from_hf(config)))
    for name, build in builds:
        try:
            e = build()
        except ValueError as err:
            out[name] = {"status": "refused", "reason": str(err)[:300]}
            continue
        if getattr(e, "position_axes", 1) != 3:
            out[name] = {"status": "differs", "reason": f"{type(e).__name__} reads "
                         f"{getattr(e, 'position_axes', 1)} position axis: image and video "
                         "positions (t, h, w) cannot be given"}  # fmt: skip
            continue
        p = pos.T[None]  # (1, S, 3)
        try:
            got_q, got_k = e.encode_qk(q.clone(), k.clone(), p, p)
        except ValueError as err:
            out[name] = {"status": "differs", "reason": f"encode_qk: {err}"[:300]}
            continue
        err = score_error(got_q, got_k, want_q, want_k)
        status = "exact" if err <= tol else "differs"
        out[name] = {"status": status, "error": f"{err:.2e}"}
        if status == "differs":
            out[name]["reason"] = f"image/video positions: {err:.2e} > tolerance {tol:.1e}"
    return out
