"""The score hooks' guard (``score_bias`` / ``score_mod`` of ALiBi and KERPLE): each of
q and k positions is a ``range`` of step 1 or an integer ``(batch|1, seq)`` tensor, their
batches broadcast; each refusal names the argument and what it got. Values are checked
against ALiBi's bias written out by hand, ``-slope * (m - n)`` (slopes 2^-4, 2^-8 for two
heads).
"""

from __future__ import annotations

import pytest
import torch
from expect import raises_exactly

from posenc.torch import ALiBi

SHAPE = "must be a range or a (batch|1, seq) tensor"


@pytest.mark.parametrize("which", ["q_positions", "k_positions"])
def test_each_position_argument_is_refused_by_name(which):
    alibi = ALiBi(2)
    good = range(3)
    for bad, got in [(range(0, 6, 2), "must be a range of step 1, got range(0, 6, 2)"),
                     ([0, 1, 2], f"{SHAPE}, got list"),
                     (torch.arange(3), f"{SHAPE}, got (3,)")]:  # fmt: skip
        args = (bad, good) if which == "q_positions" else (good, bad)
        with raises_exactly(f"{which} {got}"):
            alibi.score_bias(*args)


def test_batches_must_broadcast():
    alibi = ALiBi(2)
    q, k = torch.arange(3).expand(2, 3), torch.arange(3).expand(3, 3)
    with raises_exactly("k_positions must have the batch of q_positions (2), got 3"):
        alibi.score_bias(q, k)
    one = torch.arange(3)[None]  # (1, 3): broadcasts against any batch
    for qp, kp in [(q, one), (one, k), (q, q.clone())]:
        bias = alibi.score_bias(qp, kp)  # (b, heads, 3, 3)
        slopes = torch.tensor([2.0**-4, 2.0**-8]).view(1, 2, 1, 1)
        want = -slopes * (qp[:, None, :, None] - kp[:, None, None, :]).to(bias.dtype)
        torch.testing.assert_close(bias.expand_as(want), want, rtol=0, atol=0)
