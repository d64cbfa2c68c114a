"""The decoder every graph of a build is written from, and the one way its weights are read.

Every exporter (export_onnx.py's packed graph, batch_graph.py's batch graph, gpu_graph.py's float graph)
builds on `PackedDecoder`: its weights, its per-layer arithmetic (norms, projections, rotary, the MLP,
the read-out) and the facts of each architecture live here once; each exporter adds only its own
attention layout. Weights come through `open_weights`, from a GGUF file (dequantized by transformers)
or from a Hugging Face checkpoint folder (safetensors, read tensor by tensor).

Architectures (`ARCHITECTURES`): qwen2, qwen3 (norms on each head's queries and keys), llama (with
Llama 3's rope scaling), mistral, gemma2 and gemma3's text decoder (scaled input embeddings, norms
before and after each block, GeGLU, `query_pre_attn_scalar`, soft-capped attention and read-out,
sliding-window layers), phi3 (fused projections, partial rotary). Anything else is refused by name.

A sliding-window layer masks by *position*, not by index in the packed sequence: a question's tokens
sit after other questions' tokens in the packed layout but continue the state's positions, and it is
the position distance that the model was trained to see within its window.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

# model_type (config.json, or the GGUF's architecture as transformers names it) -> the family handled here.
ARCHITECTURES = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "llama": "llama",
    "mistral": "mistral",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
}
SUPPORTED = "qwen2, qwen3, llama (3.x rope scaling included), mistral, gemma2, gemma3 (text), phi3"

# Rope types whose frequencies do not depend on the sequence's length: computed once, as transformers does.
STATIC_ROPE = {"default", "linear", "llama3", "yarn"}

# Known architectures refused for a reason worth saying.
WHY_NOT = {
    "gemma4": "Gemma 4's text decoder mixes head sizes across layers and shares keys and values between layers, "
              "which the graphs' one-shape key/value cache cannot hold",
    "gemma4_text": "Gemma 4's text decoder mixes head sizes across layers and shares keys and values between layers, "
                   "which the graphs' one-shape key/value cache cannot hold",
    "qwen3_next": "its linear-attention layers keep a recurrent state, not keys and values",
    "qwen3_5": "its linear-attention layers keep a recurrent state, not keys and values",
    "qwen3_5_text": "its linear-attention layers keep a recurrent state, not keys and values",
    "qwen3_moe": "mixture-of-experts layers are not written by the exporters",
    "mixtral": "mixture-of-experts layers are not written by the exporters",
}


class Unsupported(Exception):
    """A model the exporters would write wrongly: refused before any conversion work."""


def refuse(model_type: str, why: str | None = None) -> Unsupported:
    reason = why or WHY_NOT.get(model_type) or "not an architecture the exporters write"
    return Unsupported(f"architecture {model_type!r} is not supported ({reason}); supported: {SUPPORTED}")


# ---- the facts of a model, from its config --------------------------------------------------------------------


@dataclass
class Spec:
    """What the decoder needs to know about a model, whatever its architecture."""

    arch: str
    model_type: str
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    head_dim: int
    vocab: int
    eps: float
    context: int
    qk_norm: bool = False
    # Gemma: norms on each block's output as well as its input.
    sandwich: bool = False
    act: str = "silu"
    embed_scale: float | None = None
    attn_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # Per layer: the sliding window (tokens a query sees, itself included) or None, and its rotary table's name.
    windows: list = field(default_factory=list)
    rope_of: list = field(default_factory=list)
    # rotary table name -> (inverse frequencies [rot_dim / 2] float32, scaling of cos and sin)
    ropes: dict = field(default_factory=dict)
    rot_dim: int = 0
    tied: bool = False


def text_config(conf):
    """The language model's config inside a multimodal one (Gemma 3's `text_config`)."""
    return conf.get_text_config() if hasattr(conf, "get_text_config") else conf


def _rope_params(conf, layer_type: str | None) -> dict:
    params = getattr(conf, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        return params[layer_type]
    return params


def _inv_freq(conf, params: dict, head_dim: int, rot_dim: int, layer_type: str | None) -> tuple[torch.Tensor, float]:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in STATIC_ROPE:
        raise refuse(conf.model_type, f"rope type {rope_type!r} changes with the sequence's length; supported rope types: "
                                      f"{', '.join(sorted(STATIC_ROPE))}")
    if rope_type == "default":
        # As the shipped builds were written (float64, then float32): their graphs stay byte for byte the same.
        theta = float(params.get("rope_theta", getattr(conf, "rope_theta", None) or 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
        return inv.float(), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](conf, "cpu", layer_type=layer_type)
    return inv.float(), float(scaling)


def describe(conf) -> Spec:
    """The decoder's facts for a transformers config, or Unsupported with the reason."""
    conf = text_config(conf)
    mt = conf.model_type
    arch = ARCHITECTURES.get(mt)
    if arch is None:
        raise refuse(mt)
    if getattr(conf, "use_bidirectional_attention", False):
        raise refuse(mt, "bidirectional attention (an embedding model, not a causal judge)")
    hidden = int(conf.hidden_size)
    heads = int(conf.num_attention_heads)
    kv = int(getattr(conf, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(conf, "head_dim", None) or hidden // heads)
    layers = int(conf.num_hidden_layers)
    partial = float((getattr(conf, "rope_parameters", None) or {}).get("partial_rotary_factor",
                    getattr(conf, "partial_rotary_factor", 1.0)) or 1.0)
    rot_dim = int(head_dim * partial)
    spec = Spec(
        arch=arch, model_type=mt, layers=layers, heads=heads, kv_heads=kv, hidden=hidden, head_dim=head_dim,
        vocab=int(conf.vocab_size), eps=float(conf.rms_norm_eps), context=int(getattr(conf, "max_position_embeddings", 4096) or 4096),
        rot_dim=rot_dim, attn_scale=1.0 / math.sqrt(head_dim), tied=bool(getattr(conf, "tie_word_embeddings", False)),
    )
    if arch in ("qwen3", "gemma3"):
        spec.qk_norm = True
    if arch in ("gemma2", "gemma3"):
        spec.sandwich = True
        act = getattr(conf, "hidden_activation", None) or getattr(conf, "hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise refuse(mt, f"MLP activation {act!r}")
        spec.act = "gelu_tanh"
        spec.embed_scale = hidden ** 0.5
        spec.attn_scale = float(conf.query_pre_attn_scalar) ** -0.5
        spec.attn_softcap = getattr(conf, "attn_logit_softcapping", None)
        spec.final_softcap = getattr(conf, "final_logit_softcapping", None)
    else:
        act = getattr(conf, "hidden_act", "silu")
        if act != "silu":
            raise refuse(mt, f"MLP activation {act!r}")

    # Which layers slide, and over how many tokens: `layer_types` where the config has them (transformers 5
    # writes them for every architecture here); Mistral and Phi-3 slide every layer where `sliding_window` is set.
    window = getattr(conf, "sliding_window", None)
    types = getattr(conf, "layer_types", None)
    if types is not None:
        if any(t not in ("sliding_attention", "full_attention") for t in types):
            raise refuse(mt, f"layer types {sorted(set(types))}")
        slides = [t == "sliding_attention" for t in types]
    else:
        slides = [window is not None] * layers
    if arch in ("qwen2", "qwen3") and not getattr(conf, "use_sliding_window", False):
        slides = [False] * layers
    spec.windows = [int(window) if s and window else None for s in slides]

    # One rotary table per layer type where the config keys them so (Gemma 3: local and global), else one.
    params = getattr(conf, "rope_parameters", None) or {}
    keyed = types is not None and any(isinstance(params.get(t), dict) for t in set(types))
    kinds = sorted(set(types)) if keyed else [None]
    for kind in kinds:
        spec.ropes[kind or "default"] = _inv_freq(conf, _rope_params(conf, kind), head_dim, rot_dim, kind)
    spec.rope_of = [(types[i] if keyed else "default") for i in range(layers)]
    return spec


# ---- weights ---------------------------------------------------------------------------------------------------


@dataclass
class Weights:
    """A model's config and its tensors under transformers' causal-LM names, read one at a time."""

    conf: object
    get: Callable[[str], torch.Tensor | None]
    n_params: int
    source: str
    # The transformers model itself where it had to be built to read the weights (GGUF): the reference checks use it.
    hf: object | None = None


# Multimodal checkpoints keep the language model under a prefix; the decoder reads `model.` and `lm_head.`.
PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
            ("model.text_model.", "model."))


def canonical_name(name: str) -> str | None:
    for old, new in PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    if name.startswith(("model.", "lm_head.")):
        return name
    return None  # a vision tower, a projector: not the text decoder's


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, every shard its index names present, or ValueError."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (folder / n).exists()]
        if missing:
            raise ValueError(f"{folder}: shards named by model.safetensors.index.json are missing: {', '.join(missing)}")
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
        raise ValueError(f"{folder}: only PyTorch pickles (*.bin); save the checkpoint as safetensors "
                         "(transformers: save_pretrained(dir, safe_serialization=True))")
    raise ValueError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def tokenizer_size(folder: Path) -> int:
    """The number of token ids the folder's tokenizer.json can produce (its vocabulary and added tokens)."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = tj.get("model", {}).get("vocab", {})
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [t["id"] for t in tj.get("added_tokens", [])]
    return max(ids) + 1 if ids else 0


def check_checkpoint(folder: Path):
    """Everything a checkpoint build needs, checked before any conversion work: its config, its architecture,
    every shard, and a tokenizer whose ids fit the model's vocabulary. Returns (config, files, spec)."""
    from transformers import AutoConfig

    if not (folder / "config.json").exists():
        raise ValueError(f"{folder}: no config.json (a Hugging Face checkpoint folder has config.json, safetensors, tokenizer.json)")
    raw = json.loads((folder / "config.json").read_text())
    mt = (raw.get("text_config") or {}).get("model_type") or raw.get("model_type")
    if ARCHITECTURES.get(mt) is None and ARCHITECTURES.get(raw.get("model_type")) is None:
        raise refuse(str(mt or raw.get("model_type")))
    conf = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    spec = describe(conf)
    files = checkpoint_files(folder)
    if not (folder / "tokenizer.json").exists():
        raise ValueError(f"{folder}: no tokenizer.json (the fast tokenizer transformers writes with save_pretrained)")
    n = tokenizer_size(folder)
    if n > spec.vocab:
        raise ValueError(f"{folder}: the tokenizer has {n} token ids but the model's vocabulary has {spec.vocab}: "
                         "they do not belong together")
    return conf, files, spec


def open_checkpoint(folder: Path) -> Weights:
    from safetensors import safe_open

    conf, files, spec = check_checkpoint(folder)
    where: dict[str, tuple[Path, str]] = {}
    n_params = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                c = canonical_name(name)
                if c is None:
                    continue
                where[c] = (f, name)
                n_params += math.prod(st.get_slice(name).get_shape())
    handles: dict[Path, object] = {}

    def get(name: str) -> torch.Tensor | None:
        hit = where.get(name)
        if hit is None:
            return None
        f, key = hit
        if f not in handles:
            handles[f] = safe_open(str(f), framework="pt")
        return handles[f].get_tensor(key).float()

    return Weights(conf=text_config(conf), get=get, n_params=n_params, source=str(folder))


def open_gguf(path: Path) -> Weights:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    hf.eval()
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    return Weights(conf=text_config(hf.config), get=sd.get, n_params=int(sum(v.numel() for v in sd.values())), source=str(path), hf=hf)


def open_weights(source: Path) -> Weights:
    """A GGUF file or a checkpoint folder."""
    return open_checkpoint(source) if source.is_dir() else open_gguf(source)


def reference_model(w: Weights):
    """transformers' own model of these weights in float32, eager attention: what the graphs are checked against."""
    if w.hf is not None:
        return w.hf
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(w.source, dtype=torch.float32, attn_implementation="eager", local_files_only=True)
    return hf.eval()


@dataclass
class Layer:
    """One decoder layer's tensors, as the decoder uses them (norm weights as multiplied, projections split)."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    q_b: torch.Tensor | None = None
    k_b: torch.Tensor | None = None
    v_b: torch.Tensor | None = None
    o_b: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    ln_attn_out: torch.Tensor | None = None
    ln_mlp_out: torch.Tensor | None = None


def layers_of(w: Weights, spec: Spec) -> Iterator[Layer]:
    """Each layer's tensors in turn, so that a converter holds one layer's source tensors at a time."""

    def need(name: str) -> torch.Tensor:
        t = w.get(name)
        if t is None:
            raise ValueError(f"{w.source}: tensor {name} is missing")
        return t

    # Gemma multiplies by (1 + w): the stored weight plus one, in float32 as transformers adds it.
    norm = (lambda t: 1.0 + t) if spec.arch in ("gemma2", "gemma3") else (lambda t: t)
    for i in range(spec.layers):
        pre = f"model.layers.{i}."
        a, m = pre + "self_attn.", pre + "mlp."
        if spec.arch == "phi3":
            qkv = need(a + "qkv_proj.weight")
            qd, kd = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
            q, k, v = qkv[:qd], qkv[qd:qd + kd], qkv[qd + kd:]
            gu = need(m + "gate_up_proj.weight")
            gate, up = gu[: gu.shape[0] // 2], gu[gu.shape[0] // 2:]
        else:
            q, k, v = need(a + "q_proj.weight"), need(a + "k_proj.weight"), need(a + "v_proj.weight")
            gate, up = need(m + "gate_proj.weight"), need(m + "up_proj.weight")
        layer = Layer(ln1=norm(need(pre + "input_layernorm.weight")), ln2=norm(need(pre + "post_attention_layernorm.weight")),
                      q=q, k=k, v=v, o=need(a + "o_proj.weight"), gate=gate, up=up, down=need(m + "down_proj.weight"),
                      q_b=w.get(a + "q_proj.bias"), k_b=w.get(a + "k_proj.bias"), v_b=w.get(a + "v_proj.bias"),
                      o_b=w.get(a + "o_proj.bias"))
        if spec.qk_norm:
            layer.q_norm, layer.k_norm = norm(need(a + "q_norm.weight")), norm(need(a + "k_norm.weight"))
        if spec.sandwich:
            # Gemma's names: post_attention_layernorm is on the attention's output, pre_feedforward_layernorm before the MLP.
            layer.ln_attn_out = layer.ln2
            layer.ln2 = norm(need(pre + "pre_feedforward_layernorm.weight"))
            layer.ln_mlp_out = norm(need(pre + "post_feedforward_layernorm.weight"))
        yield layer


# ---- the decoder -----------------------------------------------------------------------------------------------

INPUTS = ["input_ids", "position_ids", "subtree_end", "gather_idx", "target_ids", "branch_slots", "slot_of", "past_kv"]
OUTPUTS = ["logprobs", "present_kv"]


class PackedDecoder(nn.Module):
    """The decoder with a tree mask (export_onnx.py's packed layout; batch_graph.py lays the same arithmetic out
    for several passes).

    Linear layers are explicit matmuls against pre-transposed weights so the
    exporter emits MatMul (quantizable to MatMulNBits), never Gemm.
    """

    def __init__(self, spec: Spec, w: Weights, embed_dtype: torch.dtype = torch.float16):
        super().__init__()
        self.spec = spec
        self.n_layers = spec.layers
        self.n_heads = spec.heads
        self.n_kv = spec.kv_heads
        self.hidden = spec.hidden
        self.head_dim = spec.head_dim
        self.eps = spec.eps
        inv, _ = spec.ropes[spec.rope_of[0]]
        self.register_buffer("inv_freq", inv, persistent=False)

        embed = w.get("model.embed_tokens.weight")
        # fp16 embedding table in the CPU graph: the gather reads a few rows, halving 500+ MB of RAM.
        self.embed = nn.Parameter(embed.to(embed_dtype), requires_grad=False)
        lm = w.get("lm_head.weight")
        self.lm_head_t = nn.Parameter((lm if lm is not None else embed).t().contiguous(), requires_grad=False)
        del embed, lm
        final = w.get("model.norm.weight")
        self.final_norm = nn.Parameter(1.0 + final if spec.sandwich else final, requires_grad=False)

        def p(t: torch.Tensor | None) -> nn.Parameter | None:
            return None if t is None else nn.Parameter(t.contiguous(), requires_grad=False)

        self.layers = nn.ModuleList()
        for src in layers_of(w, spec):
            m = nn.Module()
            m.ln1 = p(src.ln1)
            m.ln2 = p(src.ln2)
            for name in ("q", "k", "v", "o"):
                setattr(m, f"{name}_t", p(getattr(src, name).t()))
                setattr(m, f"{name}_b", p(getattr(src, f"{name}_b")))
            m.gate_t = p(src.gate.t())
            m.up_t = p(src.up.t())
            m.down_t = p(src.down.t())
            if spec.qk_norm:
                m.q_norm, m.k_norm = p(src.q_norm), p(src.k_norm)
            if spec.sandwich:
                m.ln_attn_out, m.ln_mlp_out = p(src.ln_attn_out), p(src.ln_mlp_out)
            self.layers.append(m)
        # The other rotary tables (Gemma 3's local and global), by name, where a layer uses one.
        self.extra_ropes = {}
        for name, (inv_k, _) in spec.ropes.items():
            if name != spec.rope_of[0]:
                self.register_buffer(f"inv_freq_{name}", inv_k, persistent=False)
                self.extra_ropes[name] = f"inv_freq_{name}"

    # -- the arithmetic every layout shares --

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # Written out as onnxruntime's fused SimplifiedLayerNormalization computed it up
        # to 1.29 (one float32 running sum of squares per row, then x / sqrt(mean + eps)
        # * w), in operators no runtime fuses: 1.30's fused kernel sums in another order,
        # and the W8A8 graph carries a norm's last-bit change into tenths of a
        # log-probability. This reads bit for bit as the fused graph read on 1.23-1.29,
        # on every runtime (docs/experiments/runtime-1.30.md). The running sum goes down
        # the columns of the transposed squares: CumSum along a row costs 2-3x as much.
        if x.dim() == 2:
            ss = torch.cumsum((x * x).t(), dim=0)[-1:].t()
            return x / torch.sqrt(ss / self.hidden + self.eps) * w
        # A head's queries or keys [heads, T, head_dim] (Qwen3's and Gemma 3's norms on each head).
        ss = torch.cumsum((x * x).transpose(-1, -2), dim=-2)[..., -1:, :].transpose(-1, -2)
        return x / torch.sqrt(ss / self.head_dim + self.eps) * w

    @staticmethod
    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.embedding(input_ids, self.embed).float()
        if self.spec.embed_scale is not None:
            x = x * torch.tensor(self.spec.embed_scale, dtype=torch.float32)
        return x

    def rope_tables(self, position_ids: torch.Tensor) -> dict:
        """cos and sin [1, T, rot_dim] of each rotary table the layers use."""
        tables = {}
        for name in [self.spec.rope_of[0], *self.extra_ropes]:
            inv = self.inv_freq if name == self.spec.rope_of[0] else getattr(self, self.extra_ropes[name])
            freqs = position_ids.float().unsqueeze(1) * inv.unsqueeze(0)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().unsqueeze(0), emb.sin().unsqueeze(0)  # [1, T, D]
            scaling = self.spec.ropes[name][1]
            if scaling != 1.0:
                cos, sin = cos * scaling, sin * scaling
            tables[name] = (cos, sin)
        return tables

    def apply_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rd = self.spec.rot_dim
        if rd == self.head_dim:
            return x * cos + self.rotate(x) * sin
        r = x[..., :rd]
        return torch.cat((r * cos + self.rotate(r) * sin, x[..., rd:]), dim=-1)

    def project(self, m: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, T):
        """A layer's queries [H, T, D] (scaled), keys and values [KV, T, D]. `T` is the caller's token count, not
        read again from `x`: a traced size would add nodes to every layer of the graph."""
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        h = self.rms(x, m.ln1)
        q = h @ m.q_t
        k = h @ m.k_t
        v = h @ m.v_t
        if m.q_b is not None:
            q = q + m.q_b
            k = k + m.k_b
            v = v + m.v_b
        q = q.view(T, H, D).transpose(0, 1)
        k = k.view(T, KV, D).transpose(0, 1)
        v = v.view(T, KV, D).transpose(0, 1)
        if self.spec.qk_norm:
            q = self.rms(q, m.q_norm)
            k = self.rms(k, m.k_norm)
        q = self.apply_rope(q, cos, sin) * self.spec.attn_scale
        k = self.apply_rope(k, cos, sin)
        return q, k, v

    def cap(self, scores: torch.Tensor) -> torch.Tensor:
        """Gemma 2's soft cap on attention scores (identity elsewhere)."""
        c = self.spec.attn_softcap
        return scores if c is None else torch.tanh(scores / c) * c

    def window(self, qpos: torch.Tensor, kpos: torch.Tensor, w: int) -> torch.Tensor:
        """0 / -inf [*qpos.shape, kpos.shape[-1]]: a key further back than the window's reach is hidden, by position."""
        far = qpos.unsqueeze(-1) - kpos.unsqueeze(-2) >= w
        return torch.zeros(far.shape).masked_fill(far, float("-inf"))

    def finish(self, m: nn.Module, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of a layer from its attention's output [T, H*D]: projection, residuals, MLP."""
        o = o @ m.o_t
        if m.o_b is not None:
            o = o + m.o_b
        if self.spec.sandwich:
            o = self.rms(o, m.ln_attn_out)
        x = x + o
        h = self.rms(x, m.ln2)
        if self.spec.act == "silu":
            y = (torch.nn.functional.silu(h @ m.gate_t) * (h @ m.up_t)) @ m.down_t
        else:
            y = (torch.nn.functional.gelu(h @ m.gate_t, approximate="tanh") * (h @ m.up_t)) @ m.down_t
        if self.spec.sandwich:
            y = self.rms(y, m.ln_mlp_out)
        return x + y

    def read_out(self, x: torch.Tensor, gather_idx: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
        h = self.rms(x.index_select(0, gather_idx), self.final_norm)
        logits = h @ self.lm_head_t
        c = self.spec.final_softcap
        if c is not None:
            logits = torch.tanh(logits / c) * c
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        return torch.gather(logits, 1, target_ids) - lse

    # -- the packed layout --

    def forward(self, input_ids, position_ids, subtree_end, gather_idx, target_ids, branch_slots, slot_of, past_kv):
        """Attention in two parts, so cost grows with the state, not with T^2.

        `past_kv` [2, layers, kv_heads, P, head_dim] is the keys and values of
        P prefix tokens computed by an earlier pass (P may be 0); the S new
        prefix tokens continue it (their positions start at P) and every token
        attends to it as to its own prefix. `present_kv` returns the keys and
        values of all P + S prefix tokens, so a later pass can start from them.

        The first S = T - R tokens are the shared prefix (causal). The last R
        tokens form B branches; `branch_slots` [B, L] lists each branch's token
        indices (padded: a pad slot repeats a real index and is recognised by
        `slot_of[slots - S] != slot`), `slot_of` [R] gives each branch token's
        slot b*L + l. A branch token attends to the whole prefix plus its own
        branch's ancestors (`j <= i <= subtree_end[j]`), never to other
        branches: prefix scores [H, B*L, S] plus branch scores [H, B, L, L]
        instead of [H, T, T].
        """
        T = input_ids.shape[0]
        R = slot_of.shape[0]
        S = T - R
        B, L = branch_slots.shape[0], branch_slots.shape[1]
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        x = self.embed_tokens(input_ids)
        neg = torch.tensor(float("-inf"))

        P = past_kv.shape[3]
        pidx = torch.arange(S, dtype=torch.int64)
        prefix_bias = torch.cat((torch.zeros(S, P), torch.zeros(S, S).masked_fill(pidx.unsqueeze(0) > pidx.unsqueeze(1), neg)), 1)
        present = []

        flat = branch_slots.reshape(-1)                                   # [B*L]
        slot_ids = torch.arange(B * L, dtype=torch.int64)
        valid = slot_of.index_select(0, flat - S) == slot_ids             # [B*L]
        g = branch_slots.unsqueeze(2)                                      # [B, L, 1] query token
        gj = branch_slots.unsqueeze(1)                                     # [B, 1, L] key token
        endj = subtree_end.index_select(0, flat).view(B, 1, L)
        ok = (gj <= g) & (g <= endj) & valid.view(B, 1, L)
        branch_bias = torch.zeros(B, L, L).masked_fill(~ok, neg)           # [B, L, L]

        # Sliding-window layers: the same masks, and keys further back than the window by position (the past's
        # keys hold positions 0..P-1).
        windows = {}
        for w in sorted({w for w in self.spec.windows if w is not None}):
            kpos = torch.cat((torch.arange(P, dtype=torch.int64), position_ids[:S]))       # [P+S]
            bpos = position_ids.index_select(0, flat)                                     # [B*L]
            windows[w] = (prefix_bias + self.window(position_ids[:S], kpos, w),
                          self.window(bpos, kpos, w),
                          branch_bias + self.window(bpos.view(B, L), bpos.view(B, L), w))

        tables = self.rope_tables(position_ids)
        rep = H // KV

        for li, m in enumerate(self.layers):
            cos, sin = tables[self.spec.rope_of[li]]
            q, k, v = self.project(m, x, cos, sin, T)
            kp = torch.cat((past_kv[0, li], k[:, :S]), 1)                   # [KV, P+S, D]
            vp = torch.cat((past_kv[1, li], v[:, :S]), 1)
            present.append(torch.stack((kp, vp)))
            PS = kp.shape[1]
            kp = kp.unsqueeze(1).expand(KV, rep, PS, D).reshape(H, PS, D)
            vp = vp.unsqueeze(1).expand(KV, rep, PS, D).reshape(H, PS, D)
            k = k.unsqueeze(1).expand(KV, rep, T, D).reshape(H, T, D)
            v = v.unsqueeze(1).expand(KV, rep, T, D).reshape(H, T, D)
            w = self.spec.windows[li]
            pb, s1b, bb = windows[w] if w is not None else (prefix_bias, None, branch_bias)

            # prefix rows: causal over the prefix
            att = torch.softmax(self.cap(q[:, :S] @ kp.transpose(1, 2)) + pb, dim=-1)
            out_p = att @ vp                                               # [H, S, D]

            # branch rows, in slot space [B*L]
            qs = q.index_select(1, flat)                                   # [H, B*L, D]
            ks = k.index_select(1, flat).view(H, B, L, D)
            vs = v.index_select(1, flat).view(H, B, L, D)
            s1 = self.cap(qs @ kp.transpose(1, 2))                         # [H, B*L, P+S]
            if s1b is not None:
                s1 = s1 + s1b
            s2 = (self.cap(qs.view(H, B, L, D) @ ks.transpose(2, 3)) + bb).view(H, B * L, L)
            p = torch.softmax(torch.cat((s1, s2), dim=-1), dim=-1)
            out_s = p[:, :, :PS] @ vp + (p[:, :, PS:].reshape(H, B, L, L) @ vs).view(H, B * L, D)
            out_r = out_s.index_select(1, slot_of)                         # [H, R, D]

            o = torch.cat((out_p, out_r), dim=1).transpose(0, 1).reshape(T, H * D)
            x = self.finish(m, x, o)

        return self.read_out(x, gather_idx, target_ids), torch.stack(present, 1)


# ---- preflight: `python scripts/decoder.py --check SOURCE` ------------------------------------------------------

# GGUF `general.architecture` -> transformers' model_type, where they differ (a Mistral GGUF says "llama").
GGUF_ARCH = {"gemma3": "gemma3_text"}


def preflight(source: Path) -> dict:
    """What a build from `source` would be, checked before any conversion work, or Unsupported / ValueError."""
    if source.is_dir():
        conf, files, spec = check_checkpoint(source)
        size = sum(f.stat().st_size for f in files)
    elif source.suffix == ".gguf" and source.exists():
        import gguf

        reader = gguf.GGUFReader(str(source))
        arch = reader.fields["general.architecture"].contents()
        if ARCHITECTURES.get(GGUF_ARCH.get(arch, arch)) is None:
            raise refuse(arch)
        if "tokenizer.ggml.tokens" not in reader.fields:
            raise ValueError(f"{source}: the GGUF carries no tokenizer")
        size = source.stat().st_size
        return {"source": str(source), "kind": "gguf", "architecture": arch, "bytes": size}
    else:
        raise ValueError(f"{source}: neither a checkpoint folder (config.json, safetensors, tokenizer.json) nor a .gguf file")
    return {"source": str(source), "kind": "checkpoint", "architecture": spec.model_type, "layers": spec.layers,
            "hidden": spec.hidden, "heads": spec.heads, "kv_heads": spec.kv_heads, "head_dim": spec.head_dim,
            "vocab": spec.vocab, "sliding_window": next((w for w in spec.windows if w), None),
            "files": [f.name for f in files], "bytes": size}


def main() -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="check a checkpoint folder or GGUF file before converting it")
    ap.add_argument("--check", required=True, type=Path)
    args = ap.parse_args()
    try:
        print(json.dumps(preflight(args.check)))
    except (Unsupported, ValueError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
