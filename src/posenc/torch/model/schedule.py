"""A position schedule: the position scheme of every attention layer of a model.

Today's models do not give every layer the same scheme: Gemma 3 alternates sliding-window
layers (RoPE base 10 000) with global ones (base 1 000 000), Llama 4 leaves every fourth
layer without RoPE and chunks the attention of the others, Ministral 3 scales its queries.
A :class:`Schedule` lists, per layer, a :class:`Layer`: the encoding of its queries, keys
or scores (``None``: none), and the window or chunk its attention is limited to; plus the
one encoding of the input embeddings. :class:`~posenc.torch.TransformerLM` takes one.
"""

from __future__ import annotations

from dataclasses import dataclass

from posenc.torch.attention.mask import check_limits
from posenc.torch.encodings.base import NoPE, PositionalEncoding
from posenc.torch.encodings.checks import check_encoding

__all__ = ["Layer", "Schedule"]

LIMITS = ("window", "chunk")


@dataclass(frozen=True, eq=False)
class Layer:
    """The position scheme of one attention layer.

    Parameters
    ----------
    encoding : PositionalEncoding, optional
        Acts on the layer's queries and keys or its scores; ``None``: no position (NoPE).
        Layers that should share one encoding (and its parameters) pass the same object.
    window : int, optional
        Sliding window: each query sees the keys of the last ``window`` positions up to its
        own (counted in positions: after left padding, within each packed document).
    chunk : int, optional
        Chunked attention: each query sees only the keys of its own chunk of ``chunk``
        positions (Llama 4).
    attention : bool, default True
        ``False`` marks a layer of the model that has no attention and so no position (a
        recurrent layer -- Mamba, Gated DeltaNet as in Qwen3-Next -- or a convolution):
        :meth:`Schedule.from_hf` lists it so that indices are the model's, with no encoding,
        window or chunk. posenc's own models run attention in every layer, where such a
        layer would be NoPE attention: not the model's layer.
    sinks : bool, default False
        A learned sink logit per head in the layer's softmax (GPT-OSS; see
        :class:`~posenc.torch.MultiHeadAttention`'s ``sinks``).
    """

    encoding: PositionalEncoding | None = None
    window: int | None = None
    chunk: int | None = None
    attention: bool = True
    sinks: bool = False

    def __post_init__(self):
        if self.encoding is not None:
            check_encoding(self.encoding)
        check_limits(self.window, self.chunk)
        if self.attention is not True and self.attention is not False:
            raise ValueError(f"attention must be True or False, got {self.attention!r}")
        if self.sinks is not True and self.sinks is not False:
            raise ValueError(f"sinks must be True or False, got {self.sinks!r}")
        if not self.attention and (self.encoding, self.window, self.chunk, self.sinks) != (
            None, None, None, False
        ):  # fmt: skip
            raise ValueError(
                "a layer without attention has no encoding, window, chunk or sinks, got "
                f"encoding={self.encoding!r}, window={self.window!r}, chunk={self.chunk!r}, "
                f"sinks={self.sinks!r}"
            )

    @property
    def limits(self) -> tuple:
        return (self.window, self.chunk)


class Schedule:
    """The position scheme of every layer of a model, and of its input.

    Parameters
    ----------
    layers : sequence of Layer
        One per attention layer, in order.
    input : PositionalEncoding, optional
        Added to the token embeddings once, before the first layer (sinusoidal, learned).

    Examples
    --------
    >>> from posenc.torch import Layer, RotaryEmbedding, Schedule
    >>> local, far = RotaryEmbedding(16, base=1e4), RotaryEmbedding(16, base=1e6)
    >>> s = Schedule([Layer(local, window=512)] * 5 + [Layer(far)])  # Gemma 3's pattern
    >>> len(s), len(s.kinds), len(s.encodings)
    (6, 2, 2)
    """

    def __init__(self, layers, *, input=None):
        self.layers = tuple(layers)
        if not self.layers:
            raise ValueError("layers must hold at least one Layer, got none")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, Layer):
                raise ValueError(f"layers[{i}] must be a Layer, got {type(layer).__name__}")
            enc = layer.encoding
            if enc is not None and "input" in enc.places and enc is not input:
                raise ValueError(
                    f"layers[{i}].encoding {type(enc).__name__} acts on the input "
                    "embeddings: pass it as input="
                )
        if input is not None and set(check_encoding(input).places) - {"input"}:
            raise ValueError(
                f"input must act on the input embeddings only, {type(input).__name__} "
                f"acts at {input.places}"
            )
        self.input = input
        axes = {e.position_axes for e in self.encodings}
        if len(axes) > 1:
            raise ValueError(
                f"every encoding must read the same number of position axes, got {sorted(axes)}"
            )

    @classmethod
    def uniform(cls, encoding, depth) -> Schedule:
        """Every layer with ``encoding`` (also the input's, if it acts there).

        Parameters
        ----------
        encoding : PositionalEncoding
            The one encoding.
        depth : int
            Number of layers.

        Returns
        -------
        Schedule
            ``depth`` identical layers.
        """
        check_encoding(encoding)
        acts_on_input = "input" in encoding.places
        return cls([Layer(encoding)] * depth, input=encoding if acts_on_input else None)

    @classmethod
    def from_hf(cls, config) -> Schedule:
        """Every layer's position scheme of a transformers config, as a :class:`Schedule`.

        Layers with the same settings share one encoding object. Reads what
        :func:`posenc.hf.schedule_from_hf` reads (per layer: RoPE or none, window, chunk,
        query temperature, rotated slice, softmax factor, learned sinks) and refuses by name
        what posenc cannot reproduce.

        Parameters
        ----------
        config : dict or object
            A parsed ``config.json`` or a transformers config object.

        Returns
        -------
        Schedule
            One :class:`Layer` per ``num_hidden_layers`` (``Layer(attention=False)`` for a
            layer without attention, as Qwen3-Next's linear-attention layers);
            ``schedule.head_dim`` is the width of the attention's queries and keys.

        Examples
        --------
        >>> from posenc.torch import Schedule
        >>> cfg = {"model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 2,
        ...        "head_dim": 32, "max_position_embeddings": 1024, "num_hidden_layers": 4,
        ...        "rope_theta": 5e5, "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 256,
        ...        "layer_types": ["chunked_attention"] * 3 + ["full_attention"],
        ...        "attn_temperature_tuning": True, "attn_scale": 0.1, "floor_scale": 8192}
        >>> s = Schedule.from_hf(cfg)
        >>> [(type(layer.encoding).__name__, layer.chunk) for layer in s][-2:]
        [('RotaryEmbedding', 256), ('QueryTemperature', None)]
        """
        from posenc.hf.schedule import schedule_from_hf
        from posenc.torch.encodings.qk.rope import RotaryEmbedding
        from posenc.torch.encodings.qk.rope_nd import MRoPE
        from posenc.torch.encodings.qk.temperature import QueryTemperature
        from posenc.torch.encodings.wrappers import ChannelSlice, SoftmaxFactor

        spec = schedule_from_hf(config)
        made, layers = {}, []
        for layer in spec["layers"]:
            if not layer["attention"]:
                layers.append(Layer(attention=False))
                continue
            key = repr(
                sorted((k, repr(v)) for k, v in layer.items()
                       if k not in ("window", "chunk", "sinks"))
            )
            if key not in made:
                rope, enc = layer["rope"], None
                if rope is not None:
                    kw = {k: v for k, v in rope.items() if k != "mrope"}
                    enc = MRoPE(**kw) if rope.get("mrope") else RotaryEmbedding(**kw)
                if enc is not None and layer["slice_start"] is not None:
                    enc = ChannelSlice(enc, start=layer["slice_start"])
                if layer["temperature"] is not None:
                    enc = QueryTemperature(enc, **layer["temperature"])
                if layer["softmax_factor"] is not None:
                    enc = SoftmaxFactor(
                        NoPE() if enc is None else enc, factor=layer["softmax_factor"]
                    )
                made[key] = enc
            layers.append(Layer(made[key], window=layer["window"], chunk=layer["chunk"],
                                sinks=layer["sinks"]))
        schedule = cls(layers)
        schedule.head_dim = spec["head_dim"]
        return schedule

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __getitem__(self, i):
        return self.layers[i]

    def encoding_of(self, i) -> PositionalEncoding:
        """The encoding of one layer (a shared :class:`~posenc.torch.NoPE` where it has none).

        Parameters
        ----------
        i : int
            Layer index.

        Returns
        -------
        PositionalEncoding
            What the layer's attention calls.
        """
        enc = self.layers[i].encoding
        return _NOPE if enc is None else enc

    @property
    def kinds(self) -> dict:
        """``{(encoding, window, chunk): [layer indices]}``: layers that share one mask plan."""
        kinds = {}
        for i, layer in enumerate(self.layers):
            key = (self.encoding_of(i), layer.window, layer.chunk)
            kinds.setdefault(key, []).append(i)
        return kinds

    @property
    def encodings(self) -> list:
        """The distinct encoding objects, the input's first (each once, in order)."""
        found = [] if self.input is None else [self.input]
        for layer in self.layers:
            enc = layer.encoding
            if enc is not None and not any(enc is e for e in found):
                found.append(enc)
        return found

    def __repr__(self):
        rows = ", ".join(
            "NoAttention"
            if not layer.attention
            else f"{type(layer.encoding).__name__ if layer.encoding is not None else 'NoPE'}"
            + (f"(window={layer.window})" if layer.window else "")
            + (f"(chunk={layer.chunk})" if layer.chunk else "")
            for layer in self.layers
        )
        inp = "" if self.input is None else f", input={type(self.input).__name__}"
        return f"Schedule([{rows}]{inp})"


_NOPE = NoPE()
