"""seqpar next to PyTorch, measured in the same run (see vs_pytorch.sh, which sets up the venv).

Prints, for the same shapes, precision (fp32, and bf16 with --precisions fp32,bf16) and thread count:
  * causal attention, S tokens, head_dim 64 (8 heads) and 128 (4 heads): seqpar's flash attention
    (`seqpar bench attn`) against torch.nn.functional.scaled_dot_product_attention, forward and
    backward GFLOPS (the same flop count for both: 4 d per visible (query, key, head) pair forward,
    2.5x that backward);
  * a training step of the reference model (4 layers, hidden 256, 4 heads / 2 KV heads, head_dim
    64, ffn 1024, vocab 256, one sequence, AdamW): `seqpar bench step` against transformers'
    LlamaForCausalLM with SDPA attention, eager and under torch.compile; tokens/s and peak RSS;
    seqpar under each --checkpoints mode (default none; e.g. none,selective at long S), each
    compared with the same PyTorch runs.
bf16 is seqpar's --precision bf16 (bf16 GEMMs and attention inputs, fp32 master weights) against
SDPA on bf16 tensors and the training step under torch.autocast("cpu", dtype=torch.bfloat16) (fp32
weights, bf16 matmuls and attention), which is what that flag does in PyTorch.
Every PyTorch measurement runs in its own child process so that its peak RSS is its own. Medians
of --repeats timed runs after one warm-up; with --rounds N every comparison is made N times, each
PyTorch run right after the seqpar run it is compared with, and the medians of the per-round ratios
are printed last (on a VM whose speed drifts by several % between minutes, paired ratios are what
can be compared). --cpus runs both on the same CPUs only (on the AMX Xeon VM, two seqpar threads free
to move over 16 vCPUs ran bf16 attention at 364-374 GFLOPS, held to two CPUs at 470-628). Not a test.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQPAR = os.path.join(ROOT, "build", "seqpar")


def rss_mib():
    # VmHWM, this process image's own peak: ru_maxrss is carried across execve on Linux, so a child
    # started from this (large) driver would report the driver's size at fork
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------------
# children: one measurement each, printing one JSON line


def child_attn(S, d, heads, repeats, precision):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dt = torch.bfloat16 if precision == "bf16" else torch.float32
    q, k, v, do = (torch.randn(1, heads, S, d, dtype=dt) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    flops = 4.0 * d * heads * S * (S + 1) / 2
    tf, tb = [], []
    for it in range(repeats + 1):
        for t in (q, k, v):
            t.grad = None
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.perf_counter()
        o.backward(do)
        t2 = time.perf_counter()
        if it:
            tf.append(t1 - t0)
            tb.append(t2 - t1)
    f, b = statistics.median(tf), statistics.median(tb)
    return {"fwd_gflops": flops / f * 1e-9, "bwd_gflops": 2.5 * flops / b * 1e-9, "fwd_s": f, "bwd_s": b}


def child_step(S, repeats, compiled, precision):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = rss_mib()
    cfg = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=S,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, 256, (1, S))
    labels = torch.randint(0, 256, (1, S))
    r = time_train_steps(model, opt, ids, labels, repeats, compiled, precision)
    r["rss_after_import_mib"] = base
    return r


def time_train_steps(model, opt, ids, labels, repeats, compiled, precision):
    """A training step (forward, backward, clipping at 1, the optimizer; bf16: autocast), eager or
    under torch.compile: one warm-up (and compilation), then the median of `repeats` timed steps."""
    import torch

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    fn = torch.compile(step) if compiled else step
    t0 = time.perf_counter()
    fn()  # warm-up (and compilation)
    warm = time.perf_counter() - t0
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    s = statistics.median(ts)
    return {"step_s": s, "tokens_per_s": ids.shape[1] / s, "peak_rss_mib": rss_mib(), "warmup_s": warm}


def run_child(args, timeout, script=__file__):
    """`script --child ARGS-JSON` in its own process: its last JSON line, or {"error": ...}."""
    cmd = [sys.executable, os.path.abspath(script), "--child", json.dumps(args)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": f"exit {out.returncode}: {tail[0][:200]}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# seqpar


def seqpar(args, threads, timeout):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([SEQPAR, "bench"] + args, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"seqpar bench {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def parse_attn(text):
    """head_dim -> (forward GFLOPS, backward GFLOPS, forward %, backward % of the same-run GEMM peak,
    forward best %, backward best %: the fastest run's share, the peak's own statistic; None if not printed)"""
    res = {}
    for m in re.finditer(r"head_dim\s+(\d+).*?forward\s+([\d.]+) GFLOPS \(\s*([\d.]+)%[^)]*?(?:best\s+([\d.]+)%)?\)"
                         r".*?backward\s+([\d.]+) GFLOPS \(\s*([\d.]+)%[^)]*?(?:best\s+([\d.]+)%)?\)", text):
        best = [float(x) if x else None for x in (m.group(4), m.group(7))]
        res[int(m.group(1))] = (float(m.group(2)), float(m.group(5)), float(m.group(3)), float(m.group(6)), *best)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq-lens", default="8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--parts", default="attn,step")
    ap.add_argument("--precisions", default="fp32", help="fp32, bf16 or fp32,bf16")
    ap.add_argument("--checkpoints", default="none",
                    help="seqpar's step under each of these --checkpoint modes (none, selective, layer), each "
                         "compared with the same PyTorch runs")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each comparison N times, seqpar and PyTorch back to back, and print the medians "
                         "of the per-round ratios (the machine's speed drifts between minutes)")
    ap.add_argument("--cpus", default="",
                    help="run every measured process (seqpar and PyTorch alike) on these CPUs only, e.g. 4,5 or "
                         "4-5 (sched_setaffinity, inherited by the children): threads then stay on their cores; "
                         "default: wherever the scheduler puts them")
    a = ap.parse_args()
    if a.cpus:
        cpus = set()
        for part in a.cpus.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cpus)
    if a.child:
        c = json.loads(a.child)
        import torch

        torch.set_num_threads(c["threads"])
        if c["kind"] == "attn":
            r = child_attn(c["S"], c["d"], c["heads"], c["repeats"], c.get("precision", "fp32"))
        else:
            r = child_step(c["S"], c["repeats"], c["compiled"], c.get("precision", "fp32"))
        print(json.dumps(r))
        return
    import torch
    import transformers

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"vs_pytorch: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, CPU {cpu}, {a.threads} threads each, "
          f"{a.precisions}; torch {torch.__version__} (capability {torch.backends.cpu.get_cpu_capability()}), "
          f"transformers {transformers.__version__}; medians of {a.repeats}; "
          f"CPUs {sorted(os.sched_getaffinity(0)) if a.cpus else 'any (unpinned)'}")
    sys.stdout.flush()
    parts = a.parts.split(",")
    for mode in a.checkpoints.split(","):
        if mode not in ("none", "selective", "layer"):
            sys.exit(f"--checkpoints: '{mode}' is not none, selective or layer")
    for prec, S in [(p, int(x)) for p in a.precisions.split(",") for x in a.seq_lens.split(",")]:
        if prec not in ("fp32", "bf16"):
            sys.exit(f"--precisions: '{prec}' is not fp32 or bf16")
        if "attn" in parts:
            ratios = {}  # (d, "fwd"|"bwd") -> ratio per round; also seqpar's % of the GEMM
            for rnd in range(1, a.rounds + 1):
                attn_round(a, prec, S, rnd, ratios)
            if a.rounds > 1:
                print(f"attention, S = {S}, {prec}: medians over {a.rounds} rounds of the per-round figures:")
                for d in (64, 128):
                    if (d, "fwd") in ratios:
                        med = {key: statistics.median(v) for key, v in ratios.items() if key[0] == d}
                        best = (f" (best runs {med[(d, 'best_fwd')]:.0f}% / {med[(d, 'best_bwd')]:.0f}%)"
                                if (d, "best_fwd") in med else "")
                        print(f"  d = {d:3d}: seqpar {med[(d, 'pct_fwd')]:.0f}% / {med[(d, 'pct_bwd')]:.0f}% of the GEMM{best}, "
                              f"ratio to SDPA {med[(d, 'fwd')]:.2f}x / {med[(d, 'bwd')]:.2f}x (per round: "
                              + ", ".join(f"{f:.2f}/{b:.2f}" for f, b in zip(ratios[(d, 'fwd')], ratios[(d, 'bwd')]))
                              + ")")
                sys.stdout.flush()
        if "step" in parts:
            ratios = {}  # (mode, name) -> (speed ratio, memory ratio, ratio at the GEMM peak) per round
            for rnd in range(1, a.rounds + 1):
                step_round(a, prec, S, rnd, ratios)
            if a.rounds > 1:
                print(f"training step, S = {S}, {prec}: medians over {a.rounds} rounds of the per-round ratios:")
                for (mode, name), v in ratios.items():
                    tops = [x[2] for x in v if x[2] is not None]
                    top = f" (at most {statistics.median(tops):.2f}x at the GEMM peak)" if tops else ""
                    print(f"  seqpar --checkpoint {mode:9s} vs {name:13s} {statistics.median(x[0] for x in v):.2f}x speed{top}, "
                          f"{statistics.median(x[1] for x in v):.1f}x less memory (per round: "
                          + ", ".join(f"{x[0]:.2f}" for x in v) + ")")
                sys.stdout.flush()


def attn_round(a, prec, S, rnd, ratios):
    """One round: seqpar's attention, then SDPA at d = 64 and 128, right after it."""
    text = seqpar(["attn", "--seq-len", str(S), "--head-dims", "64,128", "--repeats", str(a.repeats),
                   "--precision", prec], a.threads, 3600)
    head = [l for l in text.splitlines() if l.startswith(("kernels", "attention tiles", "BLAS:", "warning:", "sgemm (", "bf16 GEMM", "attention ("))]
    print("\n".join("  seqpar " + l for l in head))
    sp = parse_attn(text)
    yard = "bf16 GEMM" if "% of bf16 GEMM" in text else "sgemm"  # bf16 on the conversion path: sgemm
    tag = f" (round {rnd} of {a.rounds}, {time.strftime('%H:%M UTC', time.gmtime())})" if a.rounds > 1 else ""
    print(f"attention, causal, S = {S}, {prec}, GFLOPS forward / backward (seqpar's % of the same-run {yard}; "
          f"ratio = seqpar / PyTorch){tag}:")
    for d, heads in ((64, 8), (128, 4)):
        t = run_child({"kind": "attn", "S": S, "d": d, "heads": heads, "repeats": a.repeats,
                       "threads": a.threads, "precision": prec}, 3600)
        s = sp.get(d)
        if "error" in t or not s:
            print(f"  d = {d:3d}, {heads} heads: seqpar {s}, PyTorch SDPA {t.get('error')}")
            continue
        rf, rb = s[0] / t["fwd_gflops"], s[1] / t["bwd_gflops"]
        for key, val in (((d, "fwd"), rf), ((d, "bwd"), rb), ((d, "pct_fwd"), s[2]), ((d, "pct_bwd"), s[3]),
                         ((d, "best_fwd"), s[4]), ((d, "best_bwd"), s[5])):
            if val is not None:
                ratios.setdefault(key, []).append(val)
        best = f"; best {s[4]:.0f}% / {s[5]:.0f}%" if s[4] is not None else ""
        print(f"  d = {d:3d}, {heads} heads: seqpar {s[0]:6.1f} / {s[1]:6.1f} ({s[2]:.0f}% / {s[3]:.0f}%{best}) | PyTorch SDPA "
              f"{t['fwd_gflops']:6.1f} / {t['bwd_gflops']:6.1f} | ratio {rf:.2f}x / {rb:.2f}x")
        sys.stdout.flush()


def step_round(a, prec, S, rnd, ratios):
    """One round: seqpar's training step (under each --checkpoints mode), then transformers' eager and
    compiled steps right after it."""
    runs = []  # (mode, tokens/s, peak RSS MiB, tokens/s at the GEMM peak or None)
    tag = f" (round {rnd} of {a.rounds}, {time.strftime('%H:%M UTC', time.gmtime())})" if a.rounds > 1 else ""
    print(f"training step, reference model, S = {S}, {prec} (tokens/s, peak RSS; ratio = seqpar / PyTorch){tag}:")
    for mode in a.checkpoints.split(","):
        text = seqpar(["step", "--seq-len", str(S), "--repeats", str(a.repeats), "--precision", prec,
                       "--checkpoint", mode], a.threads, 3600)
        m = re.search(r"([\d.]+) tokens/s.*?peak tracked memory ([\d.]+) MiB, peak RSS ([\d.]+) MiB", text)
        if not m:
            sys.exit("could not parse seqpar bench step output:\n" + text)
        sp_tok, sp_tracked, sp_rss = float(m.group(1)), float(m.group(2)), float(m.group(3))
        c = re.search(r"the step at the \S+ peak: [\d.]+ s/step, ([\d.]+) tokens/s", text)
        ceiling = float(c.group(1)) if c else None
        runs.append((mode, sp_tok, sp_rss, ceiling))
        print(f"  seqpar --checkpoint {mode:9s}     {sp_tok:8.0f} tokens/s | peak RSS {sp_rss:7.0f} MiB "
              f"(tracked buffers {sp_tracked:.0f} MiB)" +
              (f"; at the same-run GEMM peak for every FLOP it executes {ceiling:.0f} tokens/s" if ceiling else ""))
        sys.stdout.flush()
    for compiled in ([False] if a.no_compile else [False, True]):
        name = "torch.compile" if compiled else "eager"
        t = run_child({"kind": "step", "S": S, "repeats": a.repeats, "compiled": compiled,
                       "threads": a.threads, "precision": prec}, 3600)
        if "error" in t:
            print(f"  LlamaForCausalLM + SDPA, {name:13s}: {t['error']}")
            continue
        extra = f" (first step with compilation {t['warmup_s']:.0f} s)" if compiled else ""
        print(f"  LlamaForCausalLM + SDPA, {name:13s} {t['tokens_per_s']:8.0f} tokens/s | peak RSS "
              f"{t['peak_rss_mib']:7.0f} MiB (after import {t['rss_after_import_mib']:.0f}){extra}")
        for mode, sp_tok, sp_rss, ceiling in runs:
            speed, mem = sp_tok / t["tokens_per_s"], t["peak_rss_mib"] / sp_rss
            ratios.setdefault((mode, name), []).append((speed, mem, ceiling / t["tokens_per_s"] if ceiling else None))
            top = (f" (at most {ceiling / t['tokens_per_s']:.2f}x with every FLOP at the GEMM peak)"
                   if ceiling else "")
            print(f"    ratio of seqpar --checkpoint {mode:9s}: {speed:.2f}x speed{top}, {mem:.1f}x less memory")
        sys.stdout.flush()

if __name__ == "__main__":
    main()
