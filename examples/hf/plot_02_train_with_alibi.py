"""
Train a Llama with ALiBi
========================

transformers' Llama has RoPE and nothing else. :func:`posenc.hf.use <posenc.torch.hf.use>` gives it any posenc
scheme: for a score bias such as ALiBi, HF's rotation becomes the identity and every
attention layer runs posenc's :func:`~posenc.torch.attend` with the bias, through the
attention function posenc registers with transformers (``model.posenc_path ==
"attention"``). Training, ``generate`` with the KV cache and saving work as for any HF
model.
"""

# %%
# ALiBi in a tiny Llama, trained for 60 steps
# -------------------------------------------
import tempfile

import matplotlib.pyplot as plt
import torch
import transformers

from posenc.experiments.text_data import corpus, train_batch
from posenc.hf import from_pretrained, use
from posenc.torch import ALiBi

config = transformers.LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
torch.manual_seed(0)
model = use(transformers.LlamaForCausalLM(config), ALiBi(4))  # one slope per query head
print(model.posenc_path, [type(e).__name__ for e in model.model.posenc_encodings])
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
train, gen, losses = corpus("train"), torch.Generator().manual_seed(0), []
for _ in range(60):
    x, _ = train_batch(train, 64, 16, gen, passkeys=0)  # (16, 64) bytes of Python source
    loss = model(x, labels=x).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())

fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
ax.plot(losses)
ax.set_xlabel("step")
ax.set_ylabel("training loss (nats per byte)")
plt.show()

# %%
# Generate with the cache: the same tokens as a full forward per token
# --------------------------------------------------------------------
# With a cache, each step's query attends to the cached keys; posenc gives them their
# positions (the last ones up to the query), so the bias is the one a full forward
# computes.
model.eval()
prompt = torch.tensor([list(b"def main(")])  # (1, 9) bytes
with torch.no_grad():
    cached = model.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    ids = prompt
    for _ in range(24):  # no cache: the whole sequence every step
        nxt = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
print(repr(bytes(cached[0].tolist())))
print("cached generate equals the full forward:", torch.equal(cached, ids))

# %%
# Save, and load again
# --------------------
# The saved ``config.json`` carries ``"rope_type": "posenc"``: transformers alone refuses
# to build the model (it would otherwise build a RoPE Llama, silently another model).
# :func:`posenc.hf.from_pretrained <posenc.torch.hf.from_pretrained>` restores the model's own parameters and puts the
# scheme back.
with tempfile.TemporaryDirectory() as path:
    model.save_pretrained(path)
    try:
        transformers.LlamaForCausalLM.from_pretrained(path)
    except KeyError as err:
        print("transformers alone:", type(err).__name__, err)
    again = from_pretrained(transformers.LlamaForCausalLM, path, ALiBi(4))
with torch.no_grad():
    diff = (again(ids).logits - model(ids).logits).abs().max()
print(f"largest logit difference after reloading: {diff:.1e}")
