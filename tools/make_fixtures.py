#!/usr/bin/env python3
"""Make the committed reference fixtures under tests/fixtures/ for seqpar's C test suite.

Each fixture is a tiny random Llama model (HF config.json + F32 model.safetensors), an llm.c
token shard (tokens.bin) holding S+1 tokens, the float64 reference loss (expected.json) and the
float64 gradient of that loss w.r.t. every parameter (grads.safetensors, stored as F32).

The contract is the one of `seqpar grad`:
    inputs = tokens[0..S-1], targets = tokens[1..S], positions 0..S-1,
    logits = model(inputs) in float64, loss = mean cross-entropy over the S positions.

The reference is Hugging Face transformers' LlamaForCausalLM (eager attention) run in float64,
with the weights being exactly the stored float32 values upcast. transformers forces a few steps
to float32 even in a float64 model (RMSNorm's upcast, the eager softmax, RoPE's cos/sin and the
`.float()` on the logits); this script patches exactly those steps to stay in float64 (see
`make_hf_float64_faithful`), and cross-checks the result against a small float64 Llama written
out here (`ref_loss`), and the gradients against central finite differences.

The C tests need neither Python nor PyTorch: the outputs are committed. Regenerate with
    python3 tools/make_fixtures.py [NAME...]  (NAMEs: only those fixtures; re-executes itself with /usr/bin/python3 if the
                                               current interpreter lacks torch)
It is seeded and deterministic (single-threaded torch), so running it again rewrites identical files.
Needs: Debian's python3-torch (1.13.1) and `pip install transformers==4.45.2 safetensors`.
"""

import json
import math
import os
import shutil
import struct
import sys

try:
    import torch
except ImportError:  # the pyenv python has no torch; Debian's python3-torch lives in /usr/bin/python3
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

import numpy as np
import torch.nn.functional as F
import transformers
import safetensors
from safetensors.numpy import save_file as np_save_file, load_file as np_load_file
from safetensors.torch import save_file as torch_save_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
try:
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3
except ImportError:  # transformers 4.45 has both; only older ones lack them
    modeling_qwen2 = modeling_qwen3 = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO, "tests", "fixtures")

FIXTURES = [
    dict(name="tiny_mha", hidden=32, inter=64, heads=4, kv=4, layers=2, vocab=61, S=24,
         tie=False, eps=1e-5, theta=10000.0, head_dim=None, seed=1001, bf16=True),
    dict(name="tiny_gqa_tied", hidden=48, inter=80, heads=6, kv=2, layers=2, vocab=73, S=33,
         tie=True, eps=1e-6, theta=10000.0, head_dim=None, seed=1002, bf16=False),
    dict(name="tiny_headdim", hidden=40, inter=96, heads=4, kv=1, layers=3, vocab=50, S=40,
         tie=False, eps=1e-5, theta=500000.0, head_dim=16, seed=1003, bf16=False),
    dict(name="tiny_long", hidden=32, inter=64, heads=4, kv=2, layers=1, vocab=64, S=256,
         tie=False, eps=1e-5, theta=10000.0, head_dim=None, seed=1004, bf16=False),
    # RoPE scaling as Llama 3.1+ checkpoints use it: with head_dim 16 and theta 1e4 the
    # wavelengths run from 6 to 2e4, so original_max_position_embeddings 256 puts pairs in all
    # three llama3 regimes (kept, smoothed, divided by factor). hf_dirs: the same weights saved
    # again by transformers itself (sharded safetensors with an index; pytorch_model.bin).
    dict(name="tiny_llama3", hidden=32, inter=48, heads=2, kv=1, layers=1, vocab=40, S=64,
         tie=False, eps=1e-5, theta=10000.0, head_dim=16, seed=1005, bf16=False, hf_dirs=True,
         rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=256)),
    dict(name="tiny_linear", hidden=32, inter=48, heads=2, kv=2, layers=1, vocab=40, S=48,
         tie=False, eps=1e-6, theta=10000.0, head_dim=16, seed=1006, bf16=False,
         rope=dict(rope_type="linear", factor=4.0)),
    # an MLP 512 wide: seqpar lays such rows out with padding (ops.h linear_row_stride), which
    # the other fixtures' widths never get
    dict(name="tiny_wide_ffn", hidden=16, inter=512, heads=2, kv=1, layers=1, vocab=40, S=40,
         tie=False, eps=1e-5, theta=10000.0, head_dim=8, seed=1007, bf16=False),
    # biases: a Qwen2 (q, k, v biased; Qwen2ForCausalLM) and a Llama with attention_bias (q, k,
    # v and o biased); made with transformers 5 (bench/.venv/bin/python tools/make_fixtures.py
    # tiny_qwen2 tiny_attn_bias), the biases random like the weights
    dict(name="tiny_qwen2", hidden=48, inter=96, heads=6, kv=2, layers=2, vocab=67, S=48,
         tie=True, eps=1e-6, theta=1000000.0, head_dim=None, seed=1008, bf16=False, family="qwen2"),
    dict(name="tiny_attn_bias", hidden=32, inter=64, heads=4, kv=2, layers=2, vocab=59, S=64,
         tie=False, eps=1e-5, theta=10000.0, head_dim=None, seed=1009, bf16=False, attn_bias=True),
    # Qwen3: RMSNorms over each head of q and k (q_norm, k_norm) before RoPE; Qwen3Config's
    # head_dim is explicit (16 here, not hidden / heads); the second with attention_bias (all four)
    dict(name="tiny_qwen3", hidden=32, inter=80, heads=4, kv=2, layers=2, vocab=61, S=40,
         tie=True, eps=1e-6, theta=1000000.0, head_dim=16, seed=1010, bf16=False, family="qwen3"),
    dict(name="tiny_qwen3_bias", hidden=48, inter=64, heads=6, kv=3, layers=2, vocab=53, S=48,
         tie=False, eps=1e-6, theta=10000.0, head_dim=8, seed=1011, bf16=False, family="qwen3", attn_bias=True),
    # sliding-window attention (key j visible to query i iff j <= i and i - j < window): a Mistral
    # (MistralForCausalLM, every layer windowed; window 7 of S = 40) and a Qwen2 with
    # use_sliding_window whose layers from max_window_layers (1) on are windowed (layer 0 full causal)
    dict(name="tiny_mistral_window", hidden=32, inter=64, heads=4, kv=2, layers=2, vocab=61, S=40,
         tie=False, eps=1e-5, theta=10000.0, head_dim=None, seed=1012, bf16=False, family="mistral", window=7),
    dict(name="tiny_qwen2_window", hidden=48, inter=96, heads=6, kv=2, layers=3, vocab=67, S=48,
         tie=True, eps=1e-6, theta=1000000.0, head_dim=None, seed=1013, bf16=False, family="qwen2",
         window=9, window_layers=1),
]

WEIGHT_STD = 0.1   # std of every matrix entry
NORM_STD = 0.1     # norm weights are 1 + NORM_STD * randn
MAX_POS = 512
SHARD_MAGIC, SHARD_VERSION = 20240520, 1


def versions():
    deb = ""
    try:
        import subprocess
        deb = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-torch"],
                             capture_output=True, text=True).stdout.strip()
    except Exception:
        pass
    t = f"torch {torch.__version__}" + (f" (Debian python3-torch {deb})" if deb else "")
    return f"transformers {transformers.__version__} / {t}, float64"


# ---------------------------------------------------------------------------------------------
# Make HF's Llama stay in float64 where it would silently drop to float32.
# ---------------------------------------------------------------------------------------------
def _rmsnorm_forward(self, hidden_states):
    # HF: hidden_states.to(float32) ... ; here: compute in the input dtype when it is float64.
    input_dtype = hidden_states.dtype
    dt = torch.float64 if input_dtype == torch.float64 else torch.float32
    hidden_states = hidden_states.to(dt)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


def _rope_params(cfg):
    """The RoPE dict of a config: rope_parameters (transformers 5) or rope_scaling + rope_theta (4)."""
    rp = getattr(cfg, "rope_parameters", None)
    if rp:
        return dict(rp)
    rs = dict(getattr(cfg, "rope_scaling", None) or {"rope_type": "default"})
    rs.setdefault("rope_type", rs.get("type", "default"))
    rs["rope_theta"] = cfg.rope_theta
    return rs


def _hf_inv_freq64(cfg):
    """transformers' own inverse frequencies, computed in float64: its rope init functions cast
    to torch.float (float32), so torch.float is pointed at float64 while they run."""
    rp = _rope_params(cfg)
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if rp["rope_type"] == "default":
        return 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    from transformers import modeling_rope_utils
    saved = torch.float
    torch.float = torch.float64
    try:
        inv_freq, attention_factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rp["rope_type"]](cfg, "cpu")
    finally:
        torch.float = saved
    assert inv_freq.dtype == torch.float64 and attention_factor == 1.0
    return inv_freq


@torch.no_grad()
def _rope_forward(self, x, position_ids):
    # HF computes freqs/cos/sin in float32 (and inv_freq in float32); here everything is float64.
    inv_freq = _hf_inv_freq64(self.config)
    freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


_orig_softmax = F.softmax


def _softmax(input, dim=None, _stacklevel=3, dtype=None):
    # HF's eager attention calls softmax(..., dtype=float32): keep float64 inputs in float64.
    if dtype == torch.float32 and input.dtype == torch.float64:
        dtype = torch.float64
    return _orig_softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)


_FAMILIES = [(modeling_llama, "Llama"), (modeling_mistral, "Mistral")] + ([(modeling_qwen2, "Qwen2"), (modeling_qwen3, "Qwen3")] if modeling_qwen2 else [])
_ORIG = [(getattr(mod, f"{n}RMSNorm").forward, getattr(mod, f"{n}RotaryEmbedding").forward) for mod, n in _FAMILIES]


def make_hf_float64_faithful(on=True):
    """Install (on=True) or remove (on=False) the float64 patches."""
    for (mod, n), orig in zip(_FAMILIES, _ORIG):
        rms, rope = (_rmsnorm_forward, _rope_forward) if on else orig
        getattr(mod, f"{n}RMSNorm").forward = rms
        getattr(mod, f"{n}RotaryEmbedding").forward = rope
    # torch.nn.functional, as used by HF eager attention
    modeling_llama.nn.functional.softmax = _softmax if on else _orig_softmax


# ---------------------------------------------------------------------------------------------
# Fixture contents
# ---------------------------------------------------------------------------------------------
def config_dict(fx):
    head_dim = fx["head_dim"] or fx["hidden"] // fx["heads"]
    sizes = {  # every family's, in the order its fixtures were written
        "hidden_act": "silu",
        "hidden_size": fx["hidden"],
        "intermediate_size": fx["inter"],
        "num_attention_heads": fx["heads"],
        "num_key_value_heads": fx["kv"],
        "num_hidden_layers": fx["layers"],
        "vocab_size": fx["vocab"],
    }
    if fx.get("family") in ("qwen2", "qwen3"):
        q3 = fx["family"] == "qwen3"
        cfg = {
            "architectures": ["Qwen3ForCausalLM" if q3 else "Qwen2ForCausalLM"],
            "model_type": fx["family"],
            **sizes,
            "max_position_embeddings": MAX_POS,
            "rms_norm_eps": fx["eps"],
            "rope_theta": fx["theta"],
            "tie_word_embeddings": fx["tie"],
            "use_sliding_window": bool(fx.get("window")),
            "sliding_window": fx.get("window", 4096),
            "max_window_layers": fx.get("window_layers", 21),
            "attention_dropout": 0.0,
            "torch_dtype": "float32",
        }
        if q3:
            cfg["head_dim"] = head_dim
            cfg["attention_bias"] = bool(fx.get("attn_bias"))
        return cfg
    if fx.get("family") == "mistral":  # Llama's layout, no biases, every layer windowed
        return {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            **sizes,
            "head_dim": head_dim,
            "max_position_embeddings": MAX_POS,
            "rms_norm_eps": fx["eps"],
            "rope_theta": fx["theta"],
            "sliding_window": fx["window"],
            "tie_word_embeddings": fx["tie"],
            "attention_dropout": 0.0,
            "torch_dtype": "float32",
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **sizes,
        "head_dim": head_dim,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": fx["eps"],
        "rope_theta": fx["theta"],
        "rope_scaling": fx.get("rope"),
        "tie_word_embeddings": fx["tie"],
        "attention_bias": bool(fx.get("attn_bias")),
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "torch_dtype": "float32",
    }


def layer_windows(fx):
    """The sliding window of each layer (None: full causal attention), from the fixture's own
    fields: a Mistral's window on every layer, a Qwen2's on the layers from window_layers on."""
    w = fx.get("window")
    return [w if w and (fx.get("family") == "mistral" or l >= fx["window_layers"]) else None
            for l in range(fx["layers"])]


def has_biases(fx):
    """(q, k, v biased, o biased): a Qwen2's q, k, v; a Llama's four with attention_bias."""
    if fx.get("family") == "qwen2":
        return True, False
    return bool(fx.get("attn_bias")), bool(fx.get("attn_bias"))  # a Llama's, a Qwen3's attention_bias


def param_shapes(fx):
    H, I, V = fx["hidden"], fx["inter"], fx["vocab"]
    D = fx["head_dim"] or H // fx["heads"]
    shapes = [("model.embed_tokens.weight", (V, H))]
    for l in range(fx["layers"]):
        p = f"model.layers.{l}."
        qkv_bias, o_bias = has_biases(fx)
        shapes += [
            (p + "input_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (fx["heads"] * D, H)),
            (p + "self_attn.k_proj.weight", (fx["kv"] * D, H)),
            (p + "self_attn.v_proj.weight", (fx["kv"] * D, H)),
            (p + "self_attn.o_proj.weight", (H, fx["heads"] * D)),
        ]
        if qkv_bias:
            shapes += [(p + "self_attn.q_proj.bias", (fx["heads"] * D,)), (p + "self_attn.k_proj.bias", (fx["kv"] * D,)),
                       (p + "self_attn.v_proj.bias", (fx["kv"] * D,))]
        if o_bias:
            shapes.append((p + "self_attn.o_proj.bias", (H,)))
        if fx.get("family") == "qwen3":
            shapes += [(p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,))]
        shapes += [
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "mlp.gate_proj.weight", (I, H)),
            (p + "mlp.up_proj.weight", (I, H)),
            (p + "mlp.down_proj.weight", (H, I)),
        ]
    shapes.append(("model.norm.weight", (H,)))
    if not fx["tie"]:
        shapes.append(("lm_head.weight", (V, H)))
    return shapes


def make_weights(fx, rng):
    w = {}
    for name, shape in param_shapes(fx):
        if name.endswith("norm.weight"):  # layernorms, the final norm, a Qwen3's q_norm / k_norm
            a = 1.0 + NORM_STD * rng.standard_normal(shape)
        else:
            a = WEIGHT_STD * rng.standard_normal(shape)
        w[name] = np.ascontiguousarray(a.astype(np.float32))
    return w


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        assert header[0] == SHARD_MAGIC and header[1] == SHARD_VERSION
        toks = np.frombuffer(f.read(), dtype="<u2")
    assert len(toks) == header[2]
    return toks


def bf16_round(a32):
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = a32.view(np.uint32).astype(np.uint64)
    assert np.all(np.isfinite(a32))
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def bf16_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def hf_loss(model, inputs, targets):
    """Mean CE of the HF model, computed by us from float64 logits.

    LlamaForCausalLM.forward computes logits = lm_head(model(...)[0]) and then calls .float() on
    them (transformers 4.45); we take the same two steps without that downcast."""
    hidden = model.model(input_ids=inputs[None], position_ids=torch.arange(len(inputs))[None],
                         use_cache=False).last_hidden_state
    logits = model.lm_head(hidden)[0]
    assert logits.dtype == torch.float64
    return F.cross_entropy(logits, targets)


def ref_loss(W, fx, inputs, targets, windows=None):
    """Independent float64 Llama (HF semantics) on a dict of float64 tensors. windows: each
    layer's sliding window (None: full causal), layer_windows(fx) by default."""
    H, nh, nkv, L = fx["hidden"], fx["heads"], fx["kv"], fx["layers"]
    D = fx["head_dim"] or H // nh
    S = len(inputs)
    eps = fx["eps"]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (fx["theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rope_cfg = fx.get("rope")
    if rope_cfg and rope_cfg["rope_type"] == "linear":  # positions / factor, i.e. frequencies / factor
        inv = inv / rope_cfg["factor"]
    elif rope_cfg and rope_cfg["rope_type"] == "llama3":  # Meta's apply_scaling, written out here
        f, lo, hi, old = (rope_cfg[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings"))
        out = []
        for fr in inv.tolist():
            wl = 2 * math.pi / fr
            if wl < old / hi:
                out.append(fr)
            elif wl > old / lo:
                out.append(fr / f)
            else:
                sm = (old / wl - lo) / (hi - lo)
                out.append((1 - sm) * fr / f + sm * fr)
        inv = torch.tensor(out, dtype=torch.float64)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]   # [S, D/2]
    cos, sin = torch.cos(ang), torch.sin(ang)

    def rope(x):  # x [S, n, D]; HF pairs element i with element i + D/2
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    if windows is None:
        windows = layer_windows(fx)
    qi, ki = torch.arange(S)[:, None], torch.arange(S)[None, :]
    x = W["model.embed_tokens.weight"][inputs]
    for l in range(L):
        p = f"model.layers.{l}."
        mask = ki > qi  # True: masked
        if windows[l] is not None:
            mask = mask | (qi - ki >= windows[l])
        def bias(name):
            return W[p + name] if p + name in W else 0.0
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T + bias("self_attn.q_proj.bias")).view(S, nh, D)
        k = (h @ W[p + "self_attn.k_proj.weight"].T + bias("self_attn.k_proj.bias")).view(S, nkv, D)
        if p + "self_attn.q_norm.weight" in W:  # Qwen3: RMSNorm over each head, before RoPE
            q, k = rms(q, W[p + "self_attn.q_norm.weight"]), rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        v = (h @ W[p + "self_attn.v_proj.weight"].T + bias("self_attn.v_proj.bias")).view(S, nkv, D)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
        att = att.masked_fill(mask[None], float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(S, nh * D)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T + bias("self_attn.o_proj.bias")
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    lm = W["model.embed_tokens.weight"] if fx["tie"] else W["lm_head.weight"]
    return F.cross_entropy(x @ lm.T, targets)


def set_weights(model, weights32):
    sd = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in weights32.items():
            sd[name].copy_(torch.from_numpy(a.astype(np.float64)))


def rel_err(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


# ---------------------------------------------------------------------------------------------
def make_fixture(fx):
    name, S = fx["name"], fx["S"]
    d = os.path.join(OUT_ROOT, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    rng = np.random.default_rng(fx["seed"])
    weights = make_weights(fx, rng)
    tokens = rng.integers(0, fx["vocab"], size=S + 1).astype(np.uint16)

    cfg = config_dict(fx)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    np_save_file(weights, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    write_shard(os.path.join(d, "tokens.bin"), tokens)

    # --- reference: HF loads the files we just wrote, upcasting F32 -> F64 --------------------
    cls = AutoModelForCausalLM if fx.get("family") else LlamaForCausalLM
    model = cls.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager")
    model.eval()  # dropout is 0 anyway
    head_dim = cfg.get("head_dim", fx["hidden"] // fx["heads"])
    assert type(model).__name__ == cfg["architectures"][0], type(model).__name__
    assert getattr(model.config, "head_dim", head_dim) == head_dim
    assert model.model.layers[0].self_attn.head_dim == head_dim, "transformers ignores head_dim"
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (fx["heads"] * head_dim, fx["hidden"])
    params = dict(model.named_parameters())  # tied lm_head is not listed separately
    if fx["tie"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sorted(params) == sorted(weights), (sorted(params), sorted(weights))
    for n, p in params.items():
        assert p.dtype == torch.float64
        assert torch.equal(p.detach(), torch.from_numpy(weights[n].astype(np.float64))), n

    toks = torch.from_numpy(read_shard(os.path.join(d, "tokens.bin")).astype(np.int64))
    assert torch.equal(toks, torch.from_numpy(tokens.astype(np.int64)))
    inputs, targets = toks[:S], toks[1:S + 1]

    model.zero_grad(set_to_none=True)
    loss = hf_loss(model, inputs, targets)
    loss.backward()
    loss_v = loss.item()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    np_save_file({n: np.ascontiguousarray(g.numpy().astype(np.float32)) for n, g in grads.items()},
                 os.path.join(d, "grads.safetensors"), metadata={"format": "pt"})

    # --- checks ----------------------------------------------------------------------------
    print(f"[{name}] S={S} loss={loss_v!r}  (ln V = {math.log(fx['vocab']):.6f})")
    # unpatched HF (its float32 steps) for information
    make_hf_float64_faithful(False)
    with torch.no_grad():
        hf32 = F.cross_entropy(model(input_ids=inputs[None], use_cache=False).logits[0].double(), targets).item()
    make_hf_float64_faithful(True)
    print(f"  plain HF forward (float32 RMSNorm/softmax/RoPE/logits inside): loss={hf32!r}  rel diff {rel_err(hf32, loss_v):.2e}")

    # independent float64 implementation
    W = {n: torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for n, a in weights.items()}
    rl = ref_loss(W, fx, inputs, targets)
    rl.backward()
    gmax = max((W[n].grad - grads[n]).abs().max().item() / max(grads[n].abs().max().item(), 1e-300)
               for n in weights)
    print(f"  own float64 Llama: loss rel diff {rel_err(rl.item(), loss_v):.2e}, worst grad diff / |grad|max {gmax:.2e}")
    assert rel_err(rl.item(), loss_v) < 1e-12 and gmax < 1e-10

    # sliding windows: transformers' own per-layer view, and that the window really changes the loss
    windows = layer_windows(fx)
    if any(windows):
        lt = getattr(model.config, "layer_types", None) or ["sliding_attention"] * fx["layers"]
        hf_windows = [model.config.sliding_window if t == "sliding_attention" else None for t in lt]
        assert hf_windows == windows, (hf_windows, windows)
        saved = model.config.sliding_window
        model.config.sliding_window = S  # i - j < S always: the same weights with the window removed
        try:
            with torch.no_grad():
                hf_full = hf_loss(model, inputs, targets).item()
        finally:
            model.config.sliding_window = saved
        with torch.no_grad():
            W0 = {n: w.detach() for n, w in W.items()}
            ref_full = ref_loss(W0, fx, inputs, targets, windows=[None] * fx["layers"]).item()
            off = [ref_loss(W0, fx, inputs, targets, windows=[w and w + dw for w in windows]).item() for dw in (-1, 1)]
        print(f"  sliding windows {windows}: loss {loss_v!r}; window removed: HF {hf_full!r}, own {ref_full!r} "
              f"(rel diff to windowed {rel_err(hf_full, loss_v):.2e}); own with windows -1/+1: rel diff "
              f"{rel_err(off[0], loss_v):.2e} / {rel_err(off[1], loss_v):.2e}")
        assert rel_err(hf_full, ref_full) < 1e-12 and rel_err(hf_full, loss_v) > 1e-4
        assert min(rel_err(o, loss_v) for o in off) > 1e-6

    # stored grads, read back with the safetensors package
    back = np_load_file(os.path.join(d, "grads.safetensors"))
    assert sorted(back) == sorted(weights)
    for n in weights:
        assert back[n].dtype == np.float32 and back[n].shape == weights[n].shape
        assert np.array_equal(back[n], grads[n].numpy().astype(np.float32))
    print(f"  grads.safetensors: {len(back)} tensors, F32, names/shapes match model.safetensors")

    # central finite differences on the float64 loss
    L = fx["layers"] - 1
    picks = ["model.layers.0.self_attn.k_proj.weight",
             f"model.layers.{L}.post_attention_layernorm.weight",
             "model.embed_tokens.weight"]
    picks += [n for n in ("model.layers.0.self_attn.q_proj.bias", f"model.layers.{L}.self_attn.o_proj.bias",
                          "model.layers.0.self_attn.k_norm.weight") if n in back]
    if layer_windows(fx)[L]:  # a windowed layer's attention
        picks.append(f"model.layers.{L}.self_attn.k_proj.weight")
    h = 1e-5
    for n in picks:
        g = back[n].astype(np.float64)
        idx = np.unravel_index(int(np.argmax(np.abs(g))), g.shape)
        p = params[n]
        with torch.no_grad():
            orig = p[idx].item()
            p[idx] = orig + h
            lp = hf_loss(model, inputs, targets).item()
            p[idx] = orig - h
            lm = hf_loss(model, inputs, targets).item()
            p[idx] = orig
        fd = (lp - lm) / (2 * h)
        an = grads[n][idx].item()
        err = rel_err(fd, an)
        print(f"  finite diff {n}{list(map(int, idx))}: analytic {an:.10e} fd {fd:.10e} rel {err:.1e}")
        assert err < 1e-6, err

    expected = {"seq_len": S, "loss": loss_v, "reference": versions()}

    # --- BF16 copy of the weights --------------------------------------------------------------
    if fx["bf16"]:
        bits = {n: bf16_round(a) for n, a in weights.items()}
        tb = {n: torch.from_numpy(a).to(torch.bfloat16) for n, a in weights.items()}
        for n in weights:  # our rounding == torch's round-to-nearest-even conversion
            assert np.array_equal(tb[n].view(torch.int16).numpy().view(np.uint16), bits[n]), n
        torch_save_file(tb, os.path.join(d, "model_bf16.safetensors"), metadata={"format": "pt"})
        w16 = {n: bf16_to_f32(b) for n, b in bits.items()}
        set_weights(model, w16)
        with torch.no_grad():
            lb = hf_loss(model, inputs, targets).item()
            Wb = {n: torch.from_numpy(a.astype(np.float64)) for n, a in w16.items()}
            lb_ref = ref_loss(Wb, fx, inputs, targets).item()
        set_weights(model, weights)
        assert rel_err(lb, lb_ref) < 1e-12
        expected["loss_bf16_weights"] = lb
        print(f"  model_bf16.safetensors: loss with bf16-rounded weights {lb!r} (own impl rel diff {rel_err(lb, lb_ref):.1e})")

    if fx.get("hf_dirs"):
        save_hf_dirs(fx, d, weights)

    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"  wrote {d} ({size} bytes)")
    return size


def save_hf_dirs(fx, d, weights):
    """The fixture's weights as transformers itself writes them: hf_sharded/ by save_pretrained
    with a small max_shard_size (model-0000k-of-0000n.safetensors + model.safetensors.index.json,
    config.json in transformers 5's rope_parameters layout), and hf_bin/ holding only
    pytorch_model.bin (torch.save of the state dict, the layout transformers 4 wrote with
    safe_serialization=False; transformers 5 writes safetensors only) for the refusal test."""
    m32 = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    sharded = os.path.join(d, "hf_sharded")
    m32.save_pretrained(sharded, max_shard_size="16KB")
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and sorted(index["weight_map"]) == sorted(weights), index
    back = {}
    for sh in shards:
        back.update(np_load_file(os.path.join(sharded, sh)))
    assert sorted(back) == sorted(weights)
    for n in weights:
        assert np.array_equal(back[n], weights[n]), n
    bind = os.path.join(d, "hf_bin")
    os.makedirs(bind)
    m32.config.save_pretrained(bind)
    torch.save(m32.state_dict(), os.path.join(bind, "pytorch_model.bin"))
    print(f"  {sharded}: {len(shards)} shards + index; {bind}: pytorch_model.bin")


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    print(f"reference: {versions()}  (safetensors {safetensors.__version__}, numpy {np.__version__})")
    make_hf_float64_faithful()
    total = 0
    only = sys.argv[1:]  # fixture names: make just those (the others stay as committed)
    for fx in FIXTURES:
        if not only or fx["name"] in only:
            total += make_fixture(fx)
    print(f"all fixtures OK, {total} bytes in total")


if __name__ == "__main__":
    main()
