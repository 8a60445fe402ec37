"""Under ``torch.compile`` the rotation is plain tensor code that inductor sees and fuses.

A ``torch.library.custom_op`` is opaque to inductor: it is not fused and runs its Python
body on every call (measured on an H200: the compiled RoPE model was 2.0x the one without
positions). The CUDA row of the dispatch table is checked here, on the CPU, by giving the
CPU the CUDA row (and Triton's interpreter, so Triton "fits"): the graph dynamo captures of a
compiled training step holds no ``posenc::`` op.
"""

import pytest
import torch

from posenc.torch import RotaryEmbedding, TransformerLM, XPos, kernels

pytest.importorskip("triton")


def _graph_ops(lm, idx):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    step = torch.compile(lm, fullgraph=True, backend=backend)
    step(idx).logsumexp(-1).mean().backward()  # forward and backward, no graph break
    assert len(graphs) == 1
    return {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}


@pytest.mark.compile
@pytest.mark.parametrize(
    "make",
    [
        lambda: RotaryEmbedding(8, max_len=32),
        lambda: RotaryEmbedding(8, pairing="interleaved", max_len=32),
        lambda: XPos(8, max_len=32),
    ],
    ids=["half", "interleaved", "xpos"],
)
def test_the_cuda_rows_compiled_training_step_holds_no_opaque_op(make, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton "fits" CPU tensors: the row decides
    for mode in ("plain", "autograd", "compile"):
        monkeypatch.setitem(kernels.TABLE, ("cpu", mode), kernels.TABLE[("cuda", mode)])
    torch.manual_seed(0)
    lm = TransformerLM(11, 16, 2, 2, encoding=make())
    idx = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(1))
    ops = _graph_ops(lm, idx)
    assert not [op for op in ops if op.startswith("posenc.")], ops
    assert any("mul" in op for op in ops)  # the rotation is there, as arithmetic
