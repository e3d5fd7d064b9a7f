#!/usr/bin/env python3
"""One training step of a real model's shape, seqpar next to PyTorch in the same run.

bench/vs_pytorch.py compares the small reference model; this takes a real configuration (a preset
named after the checkpoint whose shape it copies, or any HF config.json), makes a random model of
it once, and times, with the same threads, sequence length and precision:
  - `seqpar train --model DIR --random-init` on one process (1 warm-up step, then --repeats steps,
    the median of the log's step_seconds; peak RSS from the log's run_end record);
  - transformers' AutoModelForCausalLM (SDPA attention) with torch.optim.AdamW and gradient
    clipping, eager and under torch.compile (the median of --repeats steps after one warm-up; peak
    RSS: the child process's VmHWM);
and prints tokens/s, peak RSS and the ratios. Both train from the same random initialisation
scheme, not the same weights: the step's work does not depend on the values.

For the benchmark only (bench/.venv; bash bench/vs_pytorch.sh makes it):
    bench/.venv/bin/python bench/vs_pytorch_model.py [--model qwen3-0.6b|qwen2.5-0.5b|llama-3.2-1b|CONFIG.json]
        [--seq-len 2048] [--precision fp32|bf16] [--repeats 2] [--threads N] [--no-compile]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQPAR = os.path.join(ROOT, "build", "seqpar")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_pytorch import run_child as run_script_child, time_train_steps  # noqa: E402

PRESETS = {  # the published configurations' sizes (random weights)
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                   "rms_norm_eps": 1e-6},
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "num_hidden_layers": 24, "vocab_size": 151936,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                     "rms_norm_eps": 1e-6},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16, "vocab_size": 128256,
                     "tie_word_embeddings": True, "rope_theta": 500000.0, "max_position_embeddings": 131072,
                     "rms_norm_eps": 1e-5,
                     "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
}


def child_step(config_path, S, repeats, compiled, precision, threads):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(os.path.dirname(config_path))
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (1, S))
    r = time_train_steps(model, opt, ids, ids, repeats, compiled, precision)
    r["params"] = sum(p.numel() for p in model.parameters())
    return r


def run_child(args, timeout):
    return run_script_child(args, timeout, __file__)


def seqpar_step(model_dir, data, S, repeats, precision, threads, timeout):
    log = os.path.join(model_dir, "train.jsonl")
    cmd = [SEQPAR, "train", "--model", model_dir, "--random-init", "--data", data, "--seq-len", str(S), "--batch", "1",
           "--steps", str(repeats + 1), "--warmup", "1", "--precision", precision, "--threads", str(threads),
           "--eval-every", "0", "--eval-batches", "1", "--quiet", "--log", log]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:200]}
    steps, rss = [], None
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if "step_seconds" in r:
                steps.append(r["step_seconds"])
            if "run_end" in r:
                rss = r["run_end"]["peak_rss_bytes_max"] / 2**20
    s = statistics.median(steps[1:])
    return {"step_s": s, "tokens_per_s": S / s, "peak_rss_mib": rss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--timeout", type=int, default=1800)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child_step(**json.loads(a.child))))
        return 0
    work = tempfile.mkdtemp(prefix="seqpar_vs_model_")
    try:
        d = os.path.join(work, "model")
        os.makedirs(d)
        cfg = PRESETS.get(a.model)
        if cfg is None:
            with open(a.model) as f:
                cfg = json.load(f)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        data = os.path.join(work, "data.txt")  # bytes as tokens: ids below 256, any vocabulary
        with open(data, "w") as f:
            f.write(" ".join(str(i) for i in range(200000)))
        print(f"{a.model}: S = {a.seq_len}, {a.precision}, {a.threads} threads, one process; medians of "
              f"{a.repeats} steps after one warm-up", flush=True)
        rows = [("seqpar", seqpar_step(d, data, a.seq_len, a.repeats, a.precision, a.threads, a.timeout))]
        for compiled in ([False] if a.no_compile else [False, True]):
            args = {"config_path": os.path.join(d, "config.json"), "S": a.seq_len, "repeats": a.repeats,
                    "compiled": compiled, "precision": a.precision, "threads": a.threads}
            rows.append(("PyTorch compiled" if compiled else "PyTorch eager", run_child(args, a.timeout)))
        base = rows[0][1]
        for name, r in rows:
            if "error" in r:
                print(f"  {name:17s} {r['error']}")
                continue
            extra = ""
            if name != "seqpar" and "error" not in base:
                extra = (f" | seqpar {base['tokens_per_s'] / r['tokens_per_s']:.2f}x the speed, "
                         f"{r['peak_rss_mib'] / base['peak_rss_mib']:.1f}x less memory")
                if "params" in r:
                    extra += f" ({r['params'] / 1e6:.1f}M parameters; warm-up {r['warmup_s']:.0f} s)"
            print(f"  {name:17s} {r['step_s']:8.2f} s/step {r['tokens_per_s']:8.1f} tokens/s  peak RSS "
                  f"{r['peak_rss_mib']:8.1f} MiB{extra}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
