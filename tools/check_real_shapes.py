#!/usr/bin/env python3
"""seqpar against transformers on real shapes: Qwen2.5-0.5B's, Qwen3-0.6B's and Llama-3.2-1B's configurations
(transformers' own random initialisation, the 1-D biases and norms moved off their initial values),
saved by save_pretrained as a user's download looks (bf16 safetensors in shards with an index,
config.json with layer_types, dtype, token ids, llama3 RoPE scaling), then the float64 loss of 64 random
tokens (ids up to 128255, an llm.c uint32 shard) in transformers, and `seqpar grad` on the same directory.

Needs torch and transformers (bench/.venv has both); not part of the test suite (models of 2-5 GB,
about 11 GB of memory at the largest).
    bench/.venv/bin/python tools/check_real_shapes.py [BUILD_DIR]
Prints each model's two losses and their relative difference; exits 1 if one is above 1e-7.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402  (the float64 patches, hf_loss)
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config  # noqa: E402

CONFIGS = {
    "Qwen2.5-0.5B": Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                                num_hidden_layers=24, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                                max_position_embeddings=32768, sliding_window=32768, use_sliding_window=False,
                                max_window_layers=21, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151643),
    "Qwen3-0.6B": Qwen3Config(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                              head_dim=128, num_hidden_layers=28, vocab_size=151936, tie_word_embeddings=True,
                              rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6,
                              bos_token_id=151643, eos_token_id=151645, attention_bias=False),
    "Llama-3.2-1B": LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                                head_dim=64, num_hidden_layers=16, vocab_size=128256, tie_word_embeddings=True,
                                max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=128000,
                                eos_token_id=[128001, 128008, 128009],
                                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8192}),
}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build")
    seqpar = os.path.join(build, "seqpar")
    torch.manual_seed(0)
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix="seqpar_real_")
    try:
        toks = np.random.default_rng(7).integers(0, 128256, size=65).astype(np.uint32)  # in every vocabulary
        shard = os.path.join(work, "tokens.bin")
        header = np.zeros(256, dtype="<i4")
        header[0], header[1], header[2] = 20240801, 7, len(toks)  # llm.c's uint32 shard
        with open(shard, "wb") as f:
            f.write(header.tobytes())
            f.write(toks.astype("<u4").tobytes())
        x = torch.from_numpy(toks.astype(np.int64))
        worst = 0.0
        for name, cfg in CONFIGS.items():
            d = os.path.join(work, name)
            m = AutoModelForCausalLM.from_config(cfg)
            with torch.no_grad():
                for _, p in m.named_parameters():
                    if p.dim() == 1:
                        p.add_(0.05 * torch.randn_like(p))
            m.to(torch.bfloat16).save_pretrained(d, max_shard_size="400MB")
            del m
            make_fixtures.make_hf_float64_faithful(True)
            m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
            with torch.no_grad():
                ref = make_fixtures.hf_loss(m, x[:64], x[1:65]).item()
            n_params = sum(p.numel() for p in m.parameters())
            del m
            out = subprocess.run([seqpar, "grad", "--model", d, "--tokens", shard, "--seq-len", "64", "--out",
                                  os.path.join(work, "grads")], capture_output=True, text=True)
            got = [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("loss: ")]
            if out.returncode != 0 or not got:
                print(f"{name}: seqpar grad failed: {out.stderr.strip()[-300:]}")
                return 1
            rel = abs(got[0] - ref) / abs(ref)
            worst = max(worst, rel)
            print(f"{name} ({n_params / 1e6:.1f}M parameters, bf16 shards): transformers float64 loss {ref!r}, "
                  f"seqpar {got[0]!r}, relative difference {rel:.1e}")
            shutil.rmtree(d)
        return 0 if worst <= 1e-7 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
