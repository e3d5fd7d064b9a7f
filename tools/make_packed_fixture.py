#!/usr/bin/env python3
"""Make tests/fixtures/tiny_packed: the reference for packed documents (`seqpar grad --pack`).

A tiny random Llama (as tools/make_fixtures.py makes them, whose helpers this script reuses:
float64 transformers with its float32 steps patched to float64) and an llm.c shard of S+1 tokens
holding several documents, each ended by the end-of-text id (config.json "eos_token_id"). The
reference is transformers' LlamaForCausalLM (eager attention, float64) on the packed window with
  position_ids restarting at 0 in each document,
  a 4D additive attention mask that lets a query see only earlier-or-equal keys of its document,
  labels = the next token, -100 where the input is the end-of-text token (its successor starts the
    next document), loss = mean cross-entropy over the remaining labels.
It is cross-checked by running every document SEPARATELY through transformers (no mask tricks,
plain positions 0..L-1) and combining: loss = sum_d n_d loss_d / sum_d n_d and the same weights for
the gradients, where n_d is the number of trained targets of document d.

Run once with Python that has transformers 5.23 / torch 2.15 (the kernels engineer's venv here):
    /work/wt/kernels/bench/.venv/bin/python tools/make_packed_fixture.py
Seeded and single-threaded, so it rewrites identical files. The C suite does not need Python.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its helpers and float64 patches)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

FX = dict(name="tiny_packed", hidden=32, inter=64, heads=4, kv=2, layers=2, vocab=64, S=64,
          tie=False, eps=1e-5, theta=10000.0, head_dim=None, seed=1101, bf16=False)
EOT = 3
# Document lengths in the window of S = 64 input tokens: ends at 6, 7 (a document that is only
# the end-of-text token), 20, 31 (the end of a 2-, 4- and 8-rank contiguous slot), 33, 47, then
# a last document cut by the window (16 tokens, no end-of-text).
DOC_LENGTHS = [7, 1, 13, 11, 2, 14, 16]


def make_tokens(rng):
    S = FX["S"]
    assert sum(DOC_LENGTHS) == S
    toks = []
    for i, n in enumerate(DOC_LENGTHS):
        body = [int(x) for x in rng.integers(0, FX["vocab"] - 1, size=n)]
        body = [x + 1 if x >= EOT else x for x in body]  # never the end-of-text id inside a document
        if i + 1 < len(DOC_LENGTHS):
            body[-1] = EOT
        toks += body
    nxt = int(rng.integers(0, FX["vocab"] - 1))
    toks.append(nxt + 1 if nxt >= EOT else nxt)  # the last target (inside the cut document)
    return np.array(toks, dtype=np.uint16)


def packed_inputs(tokens):
    S = FX["S"]
    inputs = torch.from_numpy(tokens[:S].astype(np.int64))
    labels = torch.from_numpy(tokens[1:S + 1].astype(np.int64)).clone()
    labels[inputs == EOT] = -100
    start, starts = 0, []
    for i in range(S):
        starts.append(start)
        if int(inputs[i]) == EOT:
            start = i + 1
    starts = torch.tensor(starts)
    pos = torch.arange(S) - starts
    same = starts[:, None] == starts[None, :]
    causal = torch.arange(S)[None, :] <= torch.arange(S)[:, None]
    mask = torch.zeros(S, S, dtype=torch.float64)
    mask[~(same & causal)] = torch.finfo(torch.float64).min
    return inputs, labels, pos, mask[None, None], starts


def packed_loss(model, inputs, labels, pos, mask):
    hidden = model.model(input_ids=inputs[None], position_ids=pos[None], attention_mask=mask,
                         use_cache=False).last_hidden_state
    logits = model.lm_head(hidden)[0]
    assert logits.dtype == torch.float64
    return F.cross_entropy(logits, labels, ignore_index=-100)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    mf.make_hf_float64_faithful()
    d = os.path.join(mf.OUT_ROOT, FX["name"])
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    rng = np.random.default_rng(FX["seed"])
    weights = mf.make_weights(FX, rng)
    tokens = make_tokens(rng)
    cfg = mf.config_dict(FX)
    cfg["eos_token_id"] = EOT
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    np_save_file(weights, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    mf.write_shard(os.path.join(d, "tokens.bin"), tokens)

    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    params = dict(model.named_parameters())
    for n, p in params.items():
        assert torch.equal(p.detach(), torch.from_numpy(weights[n].astype(np.float64))), n

    inputs, labels, pos, mask, starts = packed_inputs(tokens)
    model.zero_grad(set_to_none=True)
    loss = packed_loss(model, inputs, labels, pos, mask)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    n_targets = int((labels != -100).sum())
    print(f"[{FX['name']}] S={FX['S']} documents={len(DOC_LENGTHS)} targets={n_targets} loss={loss.item()!r}")

    # cross-check: every document on its own, combined with weights n_d / sum n_d
    S, total, comb = FX["S"], 0.0, {n: torch.zeros_like(g) for n, g in grads.items()}
    s0 = 0
    for length in DOC_LENGTHS:
        doc_in = inputs[s0:s0 + length]
        doc_lab = labels[s0:s0 + length]
        n_d = int((doc_lab != -100).sum())
        s0 += length
        if n_d == 0:
            continue
        model.zero_grad(set_to_none=True)
        hidden = model.model(input_ids=doc_in[None], position_ids=torch.arange(length)[None],
                             use_cache=False).last_hidden_state
        ld = F.cross_entropy(model.lm_head(hidden)[0], doc_lab, ignore_index=-100)
        (ld * n_d / n_targets).backward()
        total += ld.item() * n_d / n_targets
        for n, p in params.items():
            comb[n] += p.grad.detach()
    assert s0 == S
    gdiff = max(((comb[n] - grads[n]).abs().max() / grads[n].abs().max().clamp_min(1e-300)).item() for n in grads)
    print(f"  documents run separately: loss rel diff {mf.rel_err(total, loss.item()):.2e}, worst grad diff / |grad|max {gdiff:.2e}")
    assert mf.rel_err(total, loss.item()) < 1e-12 and gdiff < 1e-10

    np_save_file({n: np.ascontiguousarray(g.numpy().astype(np.float32)) for n, g in grads.items()},
                 os.path.join(d, "grads.safetensors"), metadata={"format": "pt"})
    expected = {"seq_len": S, "loss": loss.item(), "eot": EOT, "documents": len(DOC_LENGTHS),
                "targets": n_targets, "doc_lengths": DOC_LENGTHS, "reference": mf.versions() +
                ", position_ids per document, 4D per-document causal mask, labels -100 after each end-of-text"}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(f"  wrote {d} ({sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))} bytes)")


if __name__ == "__main__":
    main()
