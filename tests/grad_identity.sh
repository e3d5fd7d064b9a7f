#!/usr/bin/env bash
# Refactor check: two seqpar binaries must write BYTE-IDENTICAL `seqpar grad` gradient files and
# print the same loss lines, over 67 tiny configurations: every strategy (2d, ulysses, ring,
# fpdt, lightseq, allgather, wallfacer), 1, 2, 3 and 4 ranks, fp32 and bf16, every checkpoint mode,
# the three layouts and both placements, GQA / MQA / KV replication, a double ring (--ring-inner),
# WallFacer teams, FPDT chunks (streamed and --no-stream), --offload-dir, FFN chunks, packed
# documents (--pack), ZeRO 1-3 with and without --zero-group, tied embeddings, attention biases and
# q/k norms, sliding windows, RoPE scalings, the MLP's padded rows, --threads, the lower kernel paths
# (SEQPAR_ISA=avx2 incl. its bf16 conversion path, scalar), small attention tiles, the attention
# backward in passes, and a random-init model with head_dim 64 at S = 512 (the kernels' full tiles).
#
# NOT part of the default suite (tests/run_tests.sh): it needs two builds. Run it before committing
# a change that must not move any result (a refactor, a move of files, a memory-only change):
#
#   bash tests/grad_identity.sh REF_SEQPAR NEW_SEQPAR     # two binaries, e.g. /tmp/base/seqpar build/seqpar
#   bash tests/grad_identity.sh --ref GITREV [BUILD]      # builds GITREV (make -j2 build/seqpar) in a
#                                                         # temporary `git worktree`, removed afterwards,
#                                                         # against BUILD/seqpar (default: build)
#
# The same binary twice (`bash tests/grad_identity.sh build/seqpar build/seqpar`) checks that the
# runs are deterministic. The inputs are this checkout's tests/fixtures. Prints one line per
# configuration and "grad_identity: N passed, N failed"; exits non-zero on any difference or on any
# run that fails (a configuration either binary refuses is a failure too). About 20 s for two
# binaries on 2 cores (plus the build with --ref). KEEP=1 keeps the temporary directory.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd) || exit 2
usage() { sed -n '12,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
abs() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; } # paths as the caller gave them

WT=""
T=$(mktemp -d /tmp/grad_identity.XXXXXX)
cleanup() {
    if [ -n "$WT" ]; then git -C "$REPO" worktree remove --force "$WT" >/dev/null 2>&1; rm -rf "$WT"; git -C "$REPO" worktree prune; fi
    if [ -n "${KEEP:-}" ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "${1:-}" = "--ref" ]; then
    [ $# -ge 2 ] || usage
    REV=$2
    BUILD=$(abs "${3:-$REPO/build}")
    commit=$(git -C "$REPO" rev-parse --verify --quiet "$REV^{commit}") || { echo "grad_identity: no commit '$REV'"; exit 2; }
    WT=$(mktemp -d /tmp/grad_identity_ref.XXXXXX)
    rmdir "$WT"
    if ! git -C "$REPO" worktree add --detach "$WT" "$commit" >"$T/worktree.log" 2>&1; then
        echo "grad_identity: git worktree add failed:"; tail -n 5 "$T/worktree.log"; WT=""; exit 2
    fi
    echo "building $REV ($(git -C "$REPO" log -1 --format='%h %s' "$commit" | cut -c1-70)) in $WT"
    t0=$SECONDS
    if ! env -u BUILD -u SANITIZE make -C "$WT" -j2 build/seqpar >"$T/build.log" 2>&1; then
        echo "grad_identity: building $REV failed:"; tail -n 20 "$T/build.log"; exit 2
    fi
    echo "built in $((SECONDS - t0)) s"
    REF="$WT/build/seqpar"
    NEW="$BUILD/seqpar"
elif [ $# -eq 2 ]; then
    REF=$(abs "$1")
    NEW=$(abs "$2")
else
    usage
fi
for b in "$REF" "$NEW"; do [ -x "$b" ] || { echo "grad_identity: $b is not an executable"; exit 2; }; done
echo "reference: $REF"
echo "new:       $NEW"

# the test runner's environment (tests/run_tests.sh, tests/lib.sh): Open MPI's ob1 transport, no MTL
# probes, no singleton daemon, root allowed, more ranks than cores, no kill grace. It changes no
# result; both binaries run under the same one.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2}
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

FIX="$REPO/tests/fixtures"
# a random-init model (no weights: --random-init --seed 7) large enough for the kernels' full
# tiles: head_dim 64, 2 query heads over 1 KV head, 2 layers, byte tokens (vocab 256), S = 512
R="$T/rand"
mkdir -p "$R" "$T/off"
cat >"$R/config.json" <<'EOF'
{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
  "num_hidden_layers": 2, "vocab_size": 256, "head_dim": 64, "max_position_embeddings": 1024,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null, "tie_word_embeddings": false,
  "attention_bias": false, "mlp_bias": false, "torch_dtype": "float32"
}
EOF
seq 1 400 | tr '\n' ' ' >"$R/tokens.txt"   # 1492 bytes

# one configuration: ranks, model (a fixture's name or "rand"), seq-len, grad's other flags; a word
# NAME=VALUE among them is set in the environment of both runs instead (a kernel path, tiles, ...)
CONFIGS=$(cat <<EOF
1 tiny_long 256
1 tiny_long 256 --checkpoint layer
1 tiny_long 256 --checkpoint selective
1 tiny_long 256 --precision bf16
1 tiny_long 256 --precision bf16 --checkpoint selective
1 tiny_headdim 40 --precision bf16 --checkpoint layer
1 tiny_gqa_tied 33 --ffn-chunks 3
1 tiny_qwen3_bias 48 --precision bf16
1 tiny_mistral_window 40 --checkpoint selective
1 tiny_packed 64 --pack
1 tiny_long 256 --strategy fpdt --chunks 4 --offload-dir @OFF
1 tiny_long 256 --strategy fpdt --chunks 2 --no-stream --checkpoint layer --precision bf16
1 rand 512
1 rand 512 --precision bf16
1 rand 512 --checkpoint selective --ffn-chunks 3
1 rand 512 --precision bf16 --checkpoint layer --offload-dir @OFF
1 rand 512 --threads 1 --precision bf16 --checkpoint selective
1 rand 512 SEQPAR_ISA=avx2
1 rand 512 SEQPAR_ISA=avx2 --precision bf16
1 tiny_long 256 SEQPAR_ISA=scalar --checkpoint selective
1 tiny_long 256 SEQPAR_ATTN_TILES=40,24,24,40
1 tiny_mha 24 --checkpoint selective
1 tiny_qwen2 48 --checkpoint layer
1 tiny_attn_bias 64 --precision bf16 --checkpoint selective
1 tiny_llama3 64
1 tiny_linear 48 --precision bf16
1 tiny_wide_ffn 40 --precision bf16
1 tiny_qwen2_window 48 --precision bf16 --checkpoint layer
2 tiny_long 256 --strategy ulysses
2 tiny_long 256 --strategy ring
2 tiny_long 256 --strategy ring --layout striped --precision bf16
2 tiny_long 256 --cp 2 --layout contiguous --checkpoint selective --offload-dir @OFF
2 tiny_long 256 --strategy lightseq --checkpoint selective
2 tiny_long 256 --strategy allgather --checkpoint layer
2 tiny_long 256 --strategy wallfacer --team 1
2 tiny_long 256 --strategy fpdt --chunks 4 --offload-dir @OFF --checkpoint layer
2 tiny_long 256 --strategy fpdt --chunks 2 --precision bf16
2 tiny_long 256 --dp 2 --zero 1
2 tiny_long 256 --dp 2 --zero 2 --precision bf16
2 tiny_long 256 --cp 2 --zero 3
2 tiny_headdim 40 --strategy ulysses --precision bf16 --checkpoint selective
2 tiny_packed 64 --pack --strategy ring --layout contiguous
2 tiny_packed 64 --pack --strategy fpdt --chunks 2 --precision bf16
2 rand 512 --strategy ring --precision bf16
2 rand 512 --strategy ulysses --checkpoint layer
2 tiny_long 256 --strategy ulysses SEQPAR_ATTN_BWD_ROWS=1 --threads 2
3 tiny_gqa_tied 33 --hp 3 --layout contiguous
3 tiny_long 255 --strategy ulysses --layout striped --precision bf16
3 tiny_qwen2_window 48 --cp 3 --checkpoint selective
4 tiny_long 256 --hp 2 --cp 2
4 tiny_long 256 --hp 2 --cp 2 --placement context-first --layout contiguous --precision bf16
4 tiny_long 256 --cp 4 --ring-inner 2
4 tiny_long 256 --strategy ring --ring-inner 1 --layout striped --checkpoint layer
4 tiny_long 256 --strategy ulysses --precision bf16 --checkpoint selective
4 tiny_long 256 --strategy lightseq --hp 2
4 tiny_long 256 --strategy lightseq --precision bf16 --checkpoint layer
4 tiny_long 256 --strategy allgather --layout striped --precision bf16
4 tiny_long 256 --strategy wallfacer --team 2
4 tiny_long 256 --strategy wallfacer --team 2 --placement ring-first --precision bf16 --checkpoint selective
4 tiny_long 256 --dp 2 --cp 2 --zero 3 --zero-group 2
4 tiny_long 256 --dp 4 --zero 2 --checkpoint layer
4 tiny_gqa_tied 32 --strategy fpdt --chunks 2 --checkpoint layer --zero 3 --dp 1
4 tiny_headdim 40 --strategy fpdt --chunks 2 --precision bf16
4 tiny_qwen3_bias 48 --dp 2 --cp 2 --zero 2 --precision bf16
4 tiny_mistral_window 40 --strategy allgather
4 tiny_packed 64 --pack --strategy wallfacer --team 2
4 rand 512 --hp 2 --cp 2 --precision bf16 --checkpoint selective
EOF
)

pass=0
fail=0
n=0
CMP_TOOL=""
for c in "$(dirname "$NEW")/tests/tool_compare_safetensors" "$REPO/build/tests/tool_compare_safetensors"; do
    [ -x "$c" ] && { CMP_TOOL=$c; break; }
done
run_grad() { # binary out np model S flags... -> writes $out (gradients) and $out.log
    local bin=$1 out=$2 np=$3 model=$4 S=$5
    shift 5
    local mdir tok extra=()
    if [ "$model" = rand ]; then mdir=$R; tok=$R/tokens.txt; extra=(--random-init --seed 7)
    else mdir=$FIX/$model; tok=$FIX/$model/tokens.bin; fi
    local envs=() args=() a
    for a in "$@"; do case "$a" in [A-Z]*=*) envs+=("$a") ;; *) args+=("$a") ;; esac; done
    local launch=(timeout 120)
    [ "$np" -gt 1 ] && launch=(timeout 120 mpirun --oversubscribe -np "$np")
    [ "$np" -gt 1 ] && envs=(OMP_NUM_THREADS=1 "${envs[@]}")
    rm -f "$out"
    env "${envs[@]}" "${launch[@]}" "$bin" grad --model "$mdir" --tokens "$tok" --seq-len "$S" --out "$out" "${extra[@]}" "${args[@]}" >"$out.log" 2>&1 </dev/null
}
t_all=$SECONDS
while read -r np model S flags; do
    [ -n "$np" ] || continue
    n=$((n + 1))
    case " $flags " in *" SEQPAR_ISA=avx2 "*) grep -qw avx2 /proc/cpuinfo || { echo "skip np $np $model $flags: no AVX2 here"; n=$((n - 1)); continue; } ;; esac
    flags=${flags//@OFF/$T/off}
    # shellcheck disable=SC2086
    set -- $flags
    name="np $np $model S=$S${flags:+ $flags}"
    name=${name//$T\/off/DIR}
    t0=$SECONDS
    run_grad "$REF" "$T/ref.$n" "$np" "$model" "$S" "$@"; rc_ref=$?
    run_grad "$NEW" "$T/new.$n" "$np" "$model" "$S" "$@"; rc_new=$?
    loss_ref=$(grep -E '^loss:' "$T/ref.$n.log")
    loss_new=$(grep -E '^loss:' "$T/new.$n.log")
    why=""
    if [ $rc_ref -ne 0 ]; then why="reference exited $rc_ref: $(tail -n 1 "$T/ref.$n.log")"
    elif [ $rc_new -ne 0 ]; then why="new exited $rc_new: $(tail -n 1 "$T/new.$n.log")"
    elif [ -z "$loss_ref" ]; then why="no loss line from the reference"
    elif [ "$loss_ref" != "$loss_new" ]; then why="loss lines differ: '$loss_ref' vs '$loss_new'"
    elif ! cmp -s "$T/ref.$n" "$T/new.$n"; then
        why="gradient files differ at $(cmp "$T/ref.$n" "$T/new.$n" 2>&1 | head -n 1 | sed -E 's/.* differ: (byte [0-9]+).*/\1/')"
        [ -n "$CMP_TOOL" ] && why="$why; $("$CMP_TOOL" "$T/new.$n" "$T/ref.$n" 0 0 2>&1 | head -n 1)"
    fi
    if [ -z "$why" ]; then
        pass=$((pass + 1)); echo "ok   $name: ${loss_new#loss: } ($((SECONDS - t0)) s)"
    else
        fail=$((fail + 1)); echo "FAIL $name: $why"
    fi
done <<<"$CONFIGS"
echo "$n configurations in $((SECONDS - t_all)) s"
echo "grad_identity: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
