#!/usr/bin/env bash
# --offload-optimizer DIR (the AdamW moments on the disk chunk tier, parallel/optimizer_offload.h),
# every multi-rank run under mpirun --oversubscribe with a timeout:
#   - 6 steps on 1 rank (--zero 0) and on 2 ranks (--zero 0, 1, 2, 3): every step's loss and the
#     saved model and optimizer files are the in-RAM optimizer's bit for bit, with the moments
#     streamed in chunks of 97 elements (SEQPAR_OPT_OFFLOAD_CHUNK=97: chunk ends inside tensors and
#     SIMD vectors, hundreds of chunks) and, on 1 rank, in the default chunks;
#   - --offload-master (ZeRO-3's parameter shard in the file too, read by every gather) on 2 ranks,
#     one and two micro-batches a rank: the same bits;
#   - a run stopped at step 3 and resumed with the moments on disk, or resumed with them in RAM,
#     gives the uninterrupted run's losses and files bit for bit (1 rank; 2 ranks under --zero 3,
#     with and without --offload-master);
#   - the offload directory is left as empty as it was (the per-rank file is unlinked at once);
#   - the memory model (seqpar memory) moves the moments (and with --offload-master the shard of
#     the weights) from RAM to the disk column;
#   - bad input: a missing directory, a file given as the directory, too little free disk
#     (train and train --dry-run), a reservation that fails (a file-size limit), --offload-master
#     without the file, outside ZeRO-3 or on one rank: one line on every rank, non-zero exit.
# Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
mpi_test_env

TRAIN=(train --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 64 --seq-len 64 --batch 4 --steps 6
       --warmup 2 --eval-every 0 --eval-seqs 4 --quiet --peak-gflops 100 --seed 3)
mkdir -p "$T/od"
# same_run NAME A B: the two runs' losses and saved files equal
same_run() {
    local f diff=""
    for f in model.safetensors optimizer.safetensors; do cmp -s "$T/$2/$f" "$T/$3/$f" || diff="$diff $f"; done
    if [ "$(losses "$T/$2.jsonl" | wc -l)" -eq 6 ] && [ "$(losses "$T/$2.jsonl")" = "$(losses "$T/$3.jsonl")" ] &&
        [ -z "$diff" ]; then ok; else
        bad "$1: not bit-identical to the in-RAM optimizer (files:$diff)"; paste <(losses "$T/$2.jsonl") <(losses "$T/$3.jsonl") | head -n 3; fi
}
# run NAME np flags...: a training run saving to $T/NAME, logging to $T/NAME.jsonl
run() {
    local name=$1 np=$2
    shift 2
    rm -rf "${T:?}/$name" "$T/$name.jsonl"
    if [ "$np" = 1 ]; then timeout 120 "$SEQPAR" "${TRAIN[@]}" "$@" --save "$T/$name" --log "$T/$name.jsonl" >"$T/$name.out" 2>&1
    else run_np "$np" "$SEQPAR" "${TRAIN[@]}" "$@" --save "$T/$name" --log "$T/$name.jsonl" >"$T/$name.out" 2>&1; fi ||
        bad "$name: status $?: $(tail -n 2 "$T/$name.out")"
}

# ---- bit-identical to the in-RAM optimizer
run ram1 1
run off1 1 --offload-optimizer "$T/od"
same_run "1 rank, default chunks" off1 ram1
SEQPAR_OPT_OFFLOAD_CHUNK=97 run off1c 1 --offload-optimizer "$T/od"
same_run "1 rank, chunks of 97" off1c ram1
for z in 0 1 2 3; do
    run "ram2z$z" 2 --cp 2 --zero $z
    SEQPAR_OPT_OFFLOAD_CHUNK=97 run "off2z$z" 2 --cp 2 --zero $z --offload-optimizer "$T/od"
    same_run "2 ranks --zero $z, chunks of 97" "off2z$z" "ram2z$z"
done
SEQPAR_OPT_OFFLOAD_CHUNK=97 run off2m 2 --cp 2 --zero 3 --offload-optimizer "$T/od" --offload-master
same_run "2 ranks --zero 3 --offload-master, chunks of 97" off2m ram2z3
run ram2dp 2 --dp 2 --zero 3
run off2dpm 2 --dp 2 --zero 3 --offload-optimizer "$T/od" --offload-master
same_run "2 ranks --dp 2 --zero 3 --offload-master (two micro-batches a rank)" off2dpm ram2dp
if grep -q 'rank 0: optimizer offload: .* MB written' "$T/off1.out" || ! grep -q 'optimizer offload' "$T/off1.out"; then ok; else
    bad "the offload's summary line: $(grep 'optimizer offload' "$T/off1.out")"; fi
if [ -z "$(ls -A "$T/od")" ]; then ok; else bad "files left in the offload directory: $(ls "$T/od")"; fi

# ---- resume: stopped at step 3 with the moments on disk, resumed with them on disk or in RAM
resume() { # NAME np uninterrupted flags...
    local name=$1 np=$2 full=$3
    shift 3
    SEQPAR_OPT_OFFLOAD_CHUNK=97 run "$name" "$np" "$@" --offload-optimizer "$T/od" --stop-at 3
    rm -f "$T/$name.jsonl"
    cp "$T/$full.jsonl" "$T/$name.head.jsonl"
    local how
    for how in disk ram; do
        local extra=()
        [ $how = disk ] && extra=(--offload-optimizer "$T/od")
        [ $how = ram ] && [ "${*: -1}" = --offload-master ] && set -- "${@:1:$#-1}" # the weights in RAM too
        rm -rf "$T/$name-$how"
        cp -r "$T/$name" "$T/$name-$how"
        if [ "$np" = 1 ]; then timeout 120 env SEQPAR_OPT_OFFLOAD_CHUNK=89 "$SEQPAR" "${TRAIN[@]}" "$@" "${extra[@]}" --resume "$T/$name-$how" --save "$T/$name-$how" --log "$T/$name-$how.tail.jsonl" >"$T/r.out" 2>&1
        else SEQPAR_OPT_OFFLOAD_CHUNK=89 run_np "$np" "$SEQPAR" "${TRAIN[@]}" "$@" "${extra[@]}" --resume "$T/$name-$how" --save "$T/$name-$how" --log "$T/$name-$how.tail.jsonl" >"$T/r.out" 2>&1; fi ||
            bad "$name resumed ($how): $(tail -n 2 "$T/r.out")"
        # the uninterrupted run's steps 1-3, then the resumed run's 4-6
        { losses "$T/$full.jsonl" | head -n 3; losses "$T/$name-$how.tail.jsonl"; } >"$T/got"
        local f diff=""
        for f in model.safetensors optimizer.safetensors; do cmp -s "$T/$name-$how/$f" "$T/$full/$f" || diff="$diff $f"; done
        if [ "$(losses "$T/$name-$how.tail.jsonl" | wc -l)" -eq 3 ] && [ "$(cat "$T/got")" = "$(losses "$T/$full.jsonl")" ] &&
            [ -z "$diff" ]; then ok; else bad "$name: resumed from step 3 with the moments $how: not the uninterrupted run (files:$diff)"; fi
    done
}
resume res1 1 ram1
resume res2 2 ram2z3 --cp 2 --zero 3
resume res2m 2 ram2z3 --cp 2 --zero 3 --offload-master

# ---- the memory model: the moments leave RAM for the disk column
M=(memory --layers 4 --hidden 512 --heads 8 --ffn 2048 --vocab 32000 --seq-len 64 --batch 1)
row() { sed -nE "s/^  optimizer moments +([0-9.]+) MiB.*/\1/p"; }
disk_row() { sed -nE "s/^  optimizer moments .* disk +([0-9.]+) MiB/\1/p"; }
ram_mib=$("$SEQPAR" "${M[@]}" | row)
out=$("$SEQPAR" "${M[@]}" --offload-optimizer "$T/od")
# in RAM: 8 bytes a parameter; offloaded: 8 buffers of 4 MiB in RAM, the moments in whole chunks on disk
if [ -n "$ram_mib" ] && [ "$(printf '%s\n' "$out" | row)" = 32.00 ] &&
    awk -v r="$ram_mib" -v d="$(printf '%s\n' "$out" | disk_row)" 'BEGIN { exit !(d >= r && d < r + 8) }' &&
    printf '%s\n' "$out" | grep -q "AdamW moments on disk in $T/od"; then ok; else
    bad "seqpar memory --offload-optimizer (in RAM: $ram_mib MiB): $(printf '%s\n' "$out" | grep 'moments')"; fi
# --offload-master on 2 ranks under ZeRO-3: the shard of the weights leaves RAM for the disk (4 bytes a
# parameter of the shard in whole chunks: half the moments' disk)
prow() { sed -nE "s/^  parameters +([0-9.]+) MiB.*/\1/p"; }
pdisk() { sed -nE "s/^  parameters .* disk +([0-9.]+) MiB/\1/p"; }
a=$("$SEQPAR" "${M[@]}" --ranks 2 --cp 2 --zero 3 --offload-optimizer "$T/od")
b=$("$SEQPAR" "${M[@]}" --ranks 2 --cp 2 --zero 3 --offload-optimizer "$T/od" --offload-master)
if awk -v a="$(printf '%s\n' "$a" | prow)" -v b="$(printf '%s\n' "$b" | prow)" -v d="$(printf '%s\n' "$b" | pdisk)" \
    -v h="$(printf '%s\n' "$a" | disk_row)" 'BEGIN { exit !(d > 0 && a - b <= d + 0.01 && a - b > d - 4.01 && d == h / 2) }'; then ok; else
    bad "seqpar memory --offload-master: parameters $(printf '%s\n' "$a" | prow) -> $(printf '%s\n' "$b" | grep '^  parameters')"; fi

# ---- bad input: one line on every rank
every_rank() { # what np words flags...
    local what=$1 np=$2 words=$3
    shift 3
    local err rc n
    err=$(run_np "$np" "$SEQPAR" "${TRAIN[@]}" --log "$T/bad.jsonl" "$@" 2>&1 >/dev/null)
    rc=$?
    n=$(printf '%s\n' "$err" | grep -c "^seqpar: error: .*$words")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq "$np" ] &&
        [ "$(printf '%s\n' "$err" | grep '^seqpar: error:' | sort -u | wc -l)" -eq 1 ]; then ok; else
        bad "$what: status $rc, $n of $np ranks: $(printf '%s' "$err" | head -n 3)"; fi
}
every_rank "a missing directory" 2 "--offload-optimizer /nonexistent-seqpar: cannot create a file there (No such file or directory)" \
    --cp 2 --offload-optimizer /nonexistent-seqpar
touch "$T/afile"
every_rank "a file as the directory" 2 "--offload-optimizer $T/afile: cannot create a file there (Not a directory)" \
    --cp 2 --offload-optimizer "$T/afile"
every_rank "an empty path" 2 "--offload-optimizer needs a directory" --cp 2 --offload-optimizer ""
every_rank "--offload-master alone" 2 "--offload-master keeps the weights' shard in the optimizer's file: add --offload-optimizer DIR" \
    --cp 2 --zero 3 --offload-master
every_rank "--offload-master under --zero 2" 2 "--offload-master moves ZeRO-3's parameter shard to disk, but under --zero 2 every rank's whole weights" \
    --cp 2 --zero 2 --offload-optimizer "$T/od" --offload-master
every_rank "--offload-master on one rank" 1 "--offload-master moves ZeRO-3's parameter shard to disk, but one rank has no shard" \
    --zero 3 --offload-optimizer "$T/od" --offload-master
# a model whose moments (8 bytes a parameter: 16 TB here) no disk here holds; its RAM passes --mem-per-rank
BIG=(--layers 1 --hidden 65536 --heads 512 --ffn 262144 --vocab 8192000 --mem-per-rank 1000000000 --offload-optimizer "$T/od")
for dry in "" --dry-run; do
    every_rank "too little disk ${dry:-(run)}" 2 "the disk tier needs .* under --offload-optimizer $T/od (.* a rank x 2 ranks of this node) but .* are free there: free space, or give --offload-optimizer on a larger disk" \
        --cp 2 $dry "${BIG[@]}"
done
# a reservation that fails (the file-size limit stands in for a full disk, its signal ignored; one
# process: mpirun's own files would meet the limit first)
err=$( (trap '' XFSZ; ulimit -f 64; timeout 60 "$SEQPAR" "${TRAIN[@]}" --log "$T/bad.jsonl" --offload-optimizer "$T/od") 2>&1 >/dev/null)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && printf '%s\n' "$err" |
    grep -q "^seqpar: error: --offload-optimizer $T/od: cannot reserve [0-9.]* [MG]iB for the optimizer state there (File too large): free space there"; then ok; else
    bad "a failing reservation: status $rc: $(printf '%s' "$err" | head -n 3)"; fi

summary test_offload_optimizer
