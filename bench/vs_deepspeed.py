"""seqpar's Ulysses against DeepSpeed-Ulysses on the same ranks, measured in the same run (see
vs_deepspeed.sh, which sets up the venv).

What a user would run instead of `mpirun -np P seqpar train --strategy ulysses`: transformers'
LlamaForCausalLM whose attention is DeepSpeed's own `deepspeed.sequence.layer.DistributedAttention`
(the DeepSpeed-Ulysses layer: an all-to-all from sequence to head shards before attention and back
after it, autograd through both) around PyTorch's SDPA (causal, GQA), the sequence split into P
contiguous shards (each rank's positions for RoPE, labels shifted before the split), the loss summed
over every rank's tokens, the gradients all-reduced over the ranks in one flat buffer (what a
data-parallel engine does), gradient clipping and AdamW: torch.distributed on gloo, one process per
rank under torchrun, --threads threads each (torch.set_num_threads). seqpar: `mpirun -np P seqpar
train --strategy ulysses` with the same model (the reference model of `seqpar bench step`: 4 layers,
hidden 256, 4 heads / 2 KV heads, head_dim 64, ffn 1024, vocab 256), S and batch 1, --threads the
same. fp32, or with --precision bf16 seqpar's --precision bf16 against the DeepSpeed step under
torch.autocast("cpu", dtype=torch.bfloat16) (fp32 weights, bf16 matmuls and attention). Each round runs seqpar then DeepSpeed right after it; the step time is the
median of the timed steps after --warmup (seqpar: its log's step_seconds; DeepSpeed: the slowest
rank's time per step, barriers around it), peak memory the largest rank's peak RSS (VmHWM). The
per-round ratios' median is printed last. Not a test.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQPAR = os.path.join(ROOT, "build", "seqpar")
MODEL = dict(layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=1024, vocab=256)


def vm_hwm_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


# ---------------------------------------------------------------------------------------------
# one rank of the DeepSpeed-Ulysses step (under torchrun)


def child(S, steps, warmup, threads, compiled, precision):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")  # DeepSpeed's comm layer, on torch.distributed's gloo
    from deepspeed.sequence.layer import DistributedAttention
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    rank, P = dist.get_rank(), dist.get_world_size()
    if S % P or MODEL["kv_heads"] % P and P % MODEL["kv_heads"]:
        sys.exit(f"S = {S} must split over {P} ranks")
    group = dist.group.WORLD

    def local_attention(q, k, v, *args, **kwargs):
        # [b, S, h / P, d] after the all-to-all: every token, this rank's heads
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        return o.transpose(1, 2)

    ulysses = DistributedAttention(local_attention, group, scatter_idx=2, gather_idx=1)

    def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
        # transformers hands [b, h, S / P, d]; DeepSpeed-Ulysses takes [b, S / P, h, d] (batch_dim_idx 0)
        out = ulysses(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), 0)
        return out, None

    AttentionInterface.register("deepspeed_ulysses", ulysses_attention)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=MODEL["vocab"], hidden_size=MODEL["hidden"], intermediate_size=MODEL["ffn"],
                      num_hidden_layers=MODEL["layers"], num_attention_heads=MODEL["heads"],
                      num_key_value_heads=MODEL["kv_heads"], head_dim=MODEL["head_dim"], max_position_embeddings=S,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_dropout=0.0)
    cfg._attn_implementation = "deepspeed_ulysses"
    model = LlamaForCausalLM(cfg).float().train()
    params = [p for p in model.parameters()]
    fwd = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, MODEL["vocab"], (1, S + 1), generator=g)  # the same sequence on every rank
    n = S // P
    lo = rank * n
    x = ids[:, lo:lo + n]
    y = ids[:, lo + 1:lo + n + 1]  # labels shifted before the split
    pos = torch.arange(lo, lo + n).unsqueeze(0)
    flat = torch.zeros(sum(p.numel() for p in params))

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = fwd(input_ids=x, position_ids=pos).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum") / S
        loss.backward()
        off = 0
        for p in params:  # one all-reduce of every gradient, as a data-parallel engine buckets them
            flat[off:off + p.numel()].copy_(p.grad.view(-1))
            off += p.numel()
        dist.all_reduce(flat)
        off = 0
        for p in params:
            p.grad.view(-1).copy_(flat[off:off + p.numel()])
            off += p.numel()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total)

    times, losses, warm = [], [], 0.0
    for it in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        losses.append(step())
        dist.barrier()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if it >= warmup:
            times.append(float(t))
        else:
            warm += float(t)
    rss = torch.tensor([vm_hwm_mib()])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        s = statistics.median(times)
        print(json.dumps({"step_s": s, "tokens_per_s": S / s, "peak_rss_mib": float(rss), "loss_first": losses[0],
                          "warmup_s": warm,
                          "deepspeed": deepspeed.__version__, "torch": torch.__version__}))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# the driver


def run_deepspeed(a, compiled):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), DS_ACCELERATOR="cpu")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.ranks}", os.path.abspath(__file__), "--child",
           json.dumps([a.seq_len, a.steps, a.warmup, a.threads, compiled, a.precision])]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = [l for l in (out.stderr + out.stdout).splitlines() if "Error" in l or "error" in l][-3:]
        sys.exit("DeepSpeed-Ulysses run failed (exit %d): %s" % (out.returncode, " | ".join(tail)[:600]))
    return json.loads(lines[-1])


def seqpar_peak_rss(proc):
    """Waits for proc (mpirun ...) and returns the largest VmHWM of its seqpar ranks, read from
    /proc while they run (a high-water mark: any read after the peak sees it)."""
    peak = 0.0
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if not f.read().split(b"\0")[0].endswith(b"seqpar"):
                        continue
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]) / 1024.0)
            except OSError:
                pass
        time.sleep(0.2)
    return peak


def run_seqpar(a):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "train.jsonl")
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(a.ranks), SEQPAR, "train", "--layers",
               str(MODEL["layers"]), "--hidden", str(MODEL["hidden"]), "--heads", str(MODEL["heads"]), "--kv-heads",
               str(MODEL["kv_heads"]), "--head-dim", str(MODEL["head_dim"]), "--ffn", str(MODEL["ffn"]), "--vocab",
               str(MODEL["vocab"]), "--seq-len", str(a.seq_len), "--batch", "1", "--steps", str(a.warmup + a.steps),
               "--strategy", "ulysses", "--threads", str(a.threads), "--precision", a.precision, "--quiet", "--log", log] + a.seqpar_flags
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        peak = seqpar_peak_rss(proc)
        if proc.returncode != 0:
            sys.exit("seqpar run failed: " + (proc.stderr.read().strip().splitlines() or ["?"])[-1])
        steps = [json.loads(l) for l in open(log) if l.startswith('{"step"')]
        steps = [s for s in steps if "step_seconds" in s]
        ts = [s["step_seconds"] for s in steps][a.warmup:]
        s = statistics.median(ts)
        return {"step_s": s, "tokens_per_s": a.seq_len / s, "peak_rss_mib": peak, "loss_first": steps[0]["loss"]}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank (default 1)")
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--compile", action="store_true", help="also DeepSpeed-Ulysses with the model under torch.compile")
    ap.add_argument("--seqpar-flags", default="", help="more flags for seqpar train, e.g. '--checkpoint selective'")
    a = ap.parse_args()
    a.seqpar_flags = a.seqpar_flags.split()
    if not os.access(SEQPAR, os.X_OK):
        sys.exit(f"{SEQPAR} is missing: run make first")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    print(f"CPU: {model}, {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{a.ranks} ranks x {a.threads} thread(s); S = {a.seq_len}, batch 1, {a.precision}; reference model")
    modes = ["eager"] + (["compiled"] if a.compile else [])
    ratios = {m: [] for m in modes}
    mem = {m: [] for m in modes}
    for r in range(1, a.rounds + 1):
        s = run_seqpar(a)
        line = (f"round {r}: seqpar ulysses {s['tokens_per_s']:.0f} tokens/s ({s['step_s']:.3f} s/step, peak RSS "
                f"{s['peak_rss_mib']:.0f} MiB/rank)")
        for m in modes:
            d = run_deepspeed(a, m == "compiled")
            ratios[m].append(d["step_s"] / s["step_s"])
            mem[m].append(d["peak_rss_mib"] / s["peak_rss_mib"])
            line += (f" | DeepSpeed-Ulysses {d['deepspeed']} {m} (torch {d['torch']}): {d['tokens_per_s']:.0f} tokens/s "
                     f"({d['step_s']:.3f} s/step, peak RSS {d['peak_rss_mib']:.0f} MiB/rank"
                     + (f", {d['warmup_s']:.0f} s to compile" if m == "compiled" else "")
                     + f"): seqpar {ratios[m][-1]:.2f}x the speed, {mem[m][-1]:.1f}x less memory")
        print(line, flush=True)
    for m in modes:
        print(f"median over {a.rounds} round(s), against DeepSpeed-Ulysses {m}: seqpar {statistics.median(ratios[m]):.2f}x "
              f"the tokens/s (per round " + ", ".join(f"{x:.2f}x" for x in ratios[m])
              + f"), {statistics.median(mem[m]):.1f}x less peak memory per rank")


if __name__ == "__main__":
    main()
