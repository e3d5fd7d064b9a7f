#!/usr/bin/env python3
"""Writes generate.json into fixture directories: what Hugging Face transformers generates greedily
from a prompt, for `seqpar sample`'s exactness test (tests/test_data.sh, tests/test_generate.c).

For each fixture: the prompt (token ids), transformers' `generate(do_sample=False)` continuation of
max_new_tokens tokens (float32 model, its KV cache, as a user runs it), the same continuation from
the float64 model (must agree), the float64 logits of every prompt position, and the smallest gap
between the two largest float64 logits along the greedy path (how far from a tie each choice was);
then the same greedy continuation under `repetition_penalty` REPETITION_PENALTY (float32 and float64
agreeing, with the smallest gap of the penalised logits along its path).

Run once with a python that has torch and transformers (made with transformers 5.23, torch 2.15;
tiny_qwen2, tiny_attn_bias, tiny_qwen3, tiny_qwen3_bias, tiny_mistral_window and tiny_qwen2_window
with transformers 5.24):
    bench/.venv/bin/python tools/make_generate_fixture.py [FIXTURE...]   (named: only those)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402  (its float64 patches for transformers' Llama, Mistral, Qwen2, Qwen3)
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM as LlamaForCausalLM  # noqa: E402  (Llama, Mistral, Qwen2 or Qwen3, by config)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
CASES = [  # fixture, prompt (ids, or bytes of a string), new tokens
    ("tiny_bytes", "ROMEO:", 48),
    ("tiny_mha", 8, 16),
    ("tiny_gqa_tied", 8, 16),
    ("tiny_llama3", 8, 16),
    ("tiny_qwen2", 8, 16),       # Qwen2ForCausalLM: q, k, v biases
    ("tiny_attn_bias", 5, 16),   # a Llama with attention_bias (5: its sixth token is 0, generate's pad id)
    ("tiny_qwen3", 8, 16),       # Qwen3ForCausalLM: per-head q/k norms
    ("tiny_qwen3_bias", 8, 16),  # and attention_bias
    # sliding windows: prompts longer than the window, so that the prompt logits see it too
    ("tiny_mistral_window", 9, 16),  # MistralForCausalLM, window 7 on every layer (9: its tenth token is 0)
    ("tiny_qwen2_window", 20, 16),   # Qwen2 with use_sliding_window: window 9 on layers 1 and 2
]


def prompt_ids(fixture, prompt):
    if isinstance(prompt, str):
        return list(prompt.encode("utf-8"))
    toks = make_fixtures.read_shard(os.path.join(ROOT, fixture, "tokens.bin"))
    return [int(t) for t in toks[:prompt]]


REPETITION_PENALTY = 1.3


def greedy(model, ids, n, **kw):
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=0,
                         eos_token_id=None, pad_token_id=0, use_cache=True, **kw)
    return out[0, len(ids):].tolist()


def greedy_penalised(model, ids, n):
    """generate(do_sample=False, repetition_penalty=...): the tokens and the smallest gap between the
    two largest processed (penalised) scores along the path"""
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=0,
                         eos_token_id=None, pad_token_id=0, use_cache=True, repetition_penalty=REPETITION_PENALTY,
                         output_scores=True, return_dict_in_generate=True)
    top2 = torch.stack([sc[0].topk(2).values for sc in out.scores])
    return out.sequences[0, len(ids):].tolist(), float((top2[:, 0] - top2[:, 1]).min())


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    only = sys.argv[1:]
    for fixture, prompt, n in CASES:
        if only and fixture not in only:
            continue
        d = os.path.join(ROOT, fixture)
        ids = prompt_ids(fixture, prompt)
        m32 = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        m32.generation_config.eos_token_id = None
        with torch.no_grad():
            g32 = greedy(m32, ids, n)
            r32, _ = greedy_penalised(m32, ids, n)
        make_fixtures.make_hf_float64_faithful(True)
        m64 = LlamaForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager").eval()
        m64.generation_config.eos_token_id = None
        with torch.no_grad():
            g64 = greedy(m64, ids, n)
            r64, rgap = greedy_penalised(m64, ids, n)
            full = torch.tensor([ids + g64])
            hidden = m64.model(input_ids=full, position_ids=torch.arange(full.shape[1])[None],
                               use_cache=False).last_hidden_state
            logits = m64.lm_head(hidden)[0]
        make_fixtures.make_hf_float64_faithful(False)
        assert g32 == g64, f"{fixture}: float32 and float64 greedy continuations differ: {g32} vs {g64}"
        assert r32 == r64, f"{fixture}: float32 and float64 penalised continuations differ: {r32} vs {r64}"
        # the greedy choice at every generated step, from the float64 logits of the whole sequence
        path = logits[len(ids) - 1:len(ids) - 1 + n]
        assert path.argmax(-1).tolist() == g64, f"{fixture}: argmax of the full forward differs from generate"
        top2 = path.topk(2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        out = {
            "prompt": ids,
            "max_new_tokens": n,
            "greedy": g32,
            "min_top2_gap": gap,
            "prompt_logits": logits[:len(ids)].tolist(),
            "repetition_penalty": REPETITION_PENALTY,
            "greedy_repetition_penalty": r32,
            "min_top2_gap_repetition_penalty": rgap,
            "reference": f"transformers {transformers.__version__} / torch {torch.__version__}: generate("
                         "do_sample=False), also with repetition_penalty, in float32 and float64 (eager "
                         "attention), logits float64",
        }
        with open(os.path.join(d, "generate.json"), "w") as f:
            json.dump(out, f)
            f.write("\n")
        print(f"{fixture}: prompt {len(ids)} tokens, greedy {g32[:12]}..., smallest top-2 gap {gap:.3g}; "
              f"penalised {r32[:12]}..., gap {rgap:.3g}")


if __name__ == "__main__":
    main()
