"""``copy.deepcopy`` of RoPE modules keeps shared objects shared (the memo reaches the
module's own state), as it does for any ``nn.Module``."""

import copy

import torch

from posenc.scaling import YaRN
from posenc.torch import RotaryEmbedding


def test_deepcopy_keeps_what_was_shared_shared():
    scaling = YaRN(factor=4.0, original_max_len=16)
    a = RotaryEmbedding(8, max_len=64, scaling=scaling)
    b = RotaryEmbedding(8, max_len=64, scaling=scaling)
    ca, cb, ca2 = copy.deepcopy([a, b, a])
    assert ca is ca2 and ca is not a
    assert ca.scaling is cb.scaling and ca.scaling is not scaling
    q = torch.randn(1, 2, 5, 8)
    torch.testing.assert_close(ca(q, q), a(q, q), rtol=0, atol=0)


class _Counted(RotaryEmbedding):
    """A user's subclass whose own method is one of its hooks: the state refers to itself."""

    def count(self, module, args):
        assert module is self
        self.calls += 1


def test_deepcopy_of_a_module_whose_hook_refers_to_itself():
    rope = _Counted(8, max_len=16)
    rope.calls = 0
    rope.register_forward_pre_hook(rope.count)
    twin = copy.deepcopy(rope)  # the hook is bound to the copy, not to None or the original
    q = torch.randn(1, 1, 3, 8)
    torch.testing.assert_close(twin(q, q), rope(q, q), rtol=0, atol=0)
    assert (rope.calls, twin.calls) == (1, 1)
