#!/usr/bin/env bash
# The data pipeline and sampling through the seqpar binary and scripts/make_shards.py: shards made
# from text and JSONL (byte-level always; with a tokenizer.json when the Python package `tokenizers`
# is importable), training over a directory or glob of shards with a bit-identical resume across
# shard boundaries (and from a checkpoint without the shard field), validation loss equal at 1, 2
# and 4 ranks under several strategies, `seqpar sample` against transformers' greedy generate, and
# one-line errors for bad input. Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
EDIT="$BUILD/tests/tool_edit_state"
PY=${PYTHON:-python3}
export SEQPAR_CACHE="$T/cache" # no venv from an earlier --setup

expect_error() { # "description" "words" command...: non-zero exit, one line on stderr holding the words
    local what=$1 words=$2
    shift 2
    local err rc
    err=$(timeout 120 "$@" 2>&1 >/dev/null)
    rc=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then bad "$what: exit status $rc"; return; fi
    if [ "$(printf '%s' "$err" | grep -c '')" -ne 1 ]; then bad "$what: expected one line on stderr, got: $err"; return; fi
    if printf '%s' "$err" | grep -qi -- "$words"; then ok; else bad "$what: message lacks '$words': $err"; fi
}
same_losses() { [ -n "$(losses "$1")" ] && [ "$(losses "$1")" = "$(losses "$2")" ]; }
val_losses() { sed -nE 's/.*"step": ([0-9]+), "val_loss": ([^,]+),.*/\1 \2/p' "$1"; }
# every value of two "step value" lists within a relative tolerance
close_lists() { # a b rtol
    [ -n "$1" ] && [ "$(printf '%s\n' "$1" | wc -l)" -eq "$(printf '%s\n' "$2" | wc -l)" ] &&
        paste <(printf '%s\n' "$1") <(printf '%s\n' "$2") | awk -v r="$3" '{ d = $2 - $4; if (d < 0) d = -d;
            if ($1 != $3 || d > r * ($4 < 0 ? -$4 : $4)) bad = 1 } END { exit bad }'
}

# ---- make_shards.py --byte-level: documents from .txt (whole, or by paragraph) and JSONL
printf 'First doc.\n\nSecond paragraph.\n' > "$T/a.txt"
printf '{"text": "j1", "id": 1}\n\n{"text": "j\xc3\xa92"}\n' > "$T/b.jsonl"
if $PY scripts/make_shards.py --byte-level "$T/a.txt" "$T/b.jsonl" --out "$T/bs" --name t --val-tokens 0 >"$T/ms.out" 2>&1; then ok; else bad "make_shards --byte-level: $(tail -n 1 "$T/ms.out")"; fi
# the shard, read back independently: header 20240520 / 1 / count, then eot + bytes of each document
want="256 $(printf 'First doc.\n\nSecond paragraph.\n' | od -An -tu1 | tr -s ' \n' ' ' | sed 's/^ //;s/ $//') 256 106 49 256 106 195 169 50"
got=$(od -An -tu2 -j 1024 -v "$T/bs/t_train_000000.bin" | tr -s ' \n' ' ' | sed 's/^ //;s/ $//')
hdr=$(od -An -td4 -N 12 "$T/bs/t_train_000000.bin" | tr -s ' ' ' ' | sed 's/^ //')
if [ "$got" = "$want" ] && [ "$hdr" = "20240520 1 $(printf '%s' "$want" | wc -w)" ]; then ok; else bad "byte-level shard: header '$hdr', tokens '$got', expected '$want'"; fi
# paragraphs as documents, shards of 16 tokens, the first 5 tokens (rounded up to whole documents: 11) held out
$PY scripts/make_shards.py --byte-level "$T/a.txt" --txt-split paragraph --out "$T/bp" --shard-size 16 --val-tokens 5 >/dev/null 2>&1
if [ "$(ls "$T/bp" | tr '\n' ' ')" = "data_train_000000.bin data_train_000001.bin data_val_000000.bin " ] &&
    [ "$(od -An -td4 -j 8 -N 4 "$T/bp/data_val_000000.bin" | tr -d ' ')" = 11 ]; then ok; else bad "make_shards paragraphs / shard size / val: $(ls "$T/bp" | tr '\n' ' ')"; fi
expect_error "make_shards: no tokenizer" "exactly one of --tokenizer" $PY scripts/make_shards.py "$T/a.txt" --out "$T/x"
expect_error "make_shards: missing input" "no_such.txt" $PY scripts/make_shards.py --byte-level "$T/no_such.txt" --out "$T/x"
printf '{"body": "x"}\n' > "$T/c.jsonl"
expect_error "make_shards: JSONL without the field" "--text-field" $PY scripts/make_shards.py --byte-level "$T/c.jsonl" --out "$T/x" --val-tokens 0
expect_error "make_shards: everything held out" "--val-tokens" $PY scripts/make_shards.py --byte-level "$T/a.txt" --out "$T/x"
# make_shards: one line, status 1, for what raised a Python traceback or did something else (an --out
# that is a file, ids outside the vocabulary to --decode (dropped), a --name with '/', JSONL that is
# not UTF-8); a --name seqpar would read as held out; an --out already holding .bin files (kept, and
# trained on with the new ones); a failed run leaves no directory it made
echo x >"$T/ms_file"
expect_error "make_shards: --out is a file" "exists and is not a directory" $PY scripts/make_shards.py --byte-level "$T/a.txt" --out "$T/ms_file" --val-tokens 0
expect_error "make_shards: --decode past the vocabulary" "id 300 is outside the vocabulary (0..256)" $PY scripts/make_shards.py --byte-level --decode 104,300
expect_error "make_shards: --name with /" "must be a file name prefix" $PY scripts/make_shards.py --byte-level "$T/a.txt" --out "$T/ms_n" --name a/b --val-tokens 0
expect_error "make_shards: --name with _val_" "holds '_val_' or '_train_'" $PY scripts/make_shards.py --byte-level "$T/a.txt" --out "$T/ms_n" --name x_val_y --val-tokens 0
printf '{"text": "ok"}\n{"text": "\xff\xfe"}\n' >"$T/bad_utf8.jsonl"
expect_error "make_shards: JSONL not UTF-8" "bad_utf8.jsonl:2 is not UTF-8 text" $PY scripts/make_shards.py --byte-level "$T/a.txt" "$T/bad_utf8.jsonl" --out "$T/ms_u" --val-tokens 0
if [ ! -e "$T/ms_u" ] && [ ! -e "$T/ms_n" ]; then ok; else bad "make_shards left a directory after failing: $(ls -d "$T"/ms_u "$T"/ms_n 2>&1)"; fi
expect_error "make_shards: --out holding shards" "already holds 1 .bin file(s) (t_train_000000.bin)" $PY scripts/make_shards.py --byte-level "$T/a.txt" --out "$T/bs" --val-tokens 0
# one document (the whole file) larger than --val-tokens: all of it held out, no training shard, and
# the validation shard it wrote removed (was left behind beside the error)
mkdir -p "$T/noval"
expect_error "make_shards: only a validation shard" "no training tokens" $PY scripts/make_shards.py --byte-level "$T/a.txt" --out "$T/noval" --val-tokens 5
if [ -z "$(ls -A "$T/noval")" ]; then ok; else bad "make_shards left $(ls "$T/noval" | head -n 3) after 'no training tokens'"; fi
# --tokenizer: the ids `tokenizers` itself gave for these documents (fixture), eot before each
TOK="$FIX/tokenizer"
if $PY -c "import tokenizers" 2>/dev/null; then
    $PY scripts/make_shards.py --tokenizer "$TOK/tokenizer.json" "$TOK/docs.jsonl" --text-field body --out "$T/ts" --val-tokens 0 >/dev/null 2>&1
    want=$($PY -c "import json; e = json.load(open('$TOK/expected.json')); print(' '.join(str(t) for d in e['ids'] for t in [e['eot']] + d))")
    got=$(od -An -tu2 -j 1024 -v "$T/ts/data_train_000000.bin" 2>/dev/null | tr -s ' \n' ' ' | sed 's/^ //;s/ $//')
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok; else bad "make_shards --tokenizer: ids differ from the tokenizer's: '$got' vs '$want'"; fi
    ids=$($PY scripts/make_shards.py --tokenizer "$TOK/tokenizer.json" --encode "Speak, speak.")
    if [ "$($PY scripts/make_shards.py --tokenizer "$TOK/tokenizer.json" --decode "$ids")" = "Speak, speak." ]; then ok; else bad "--encode / --decode round trip"; fi
else
    echo "note: '$PY' has no 'tokenizers' package: make_shards.py --tokenizer checked only for its message (set PYTHON to one that has it)"
    expect_error "make_shards: tokenizers missing" "--setup" $PY scripts/make_shards.py --tokenizer "$TOK/tokenizer.json" "$TOK/docs.jsonl" --out "$T/x"
fi

# ---- training over shards: a directory, read in name order, sequences crossing shard boundaries
head -c 6000 README.md > "$T/shake.txt"
$PY scripts/make_shards.py --byte-level "$T/shake.txt" --txt-split paragraph --out "$T/sh" --shard-size 300 --val-tokens 500 >/dev/null 2>&1
M=(--layers 1 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --seq-len 64 --batch 2 --warmup 2 --peak-gflops 100 --seed 3 --quiet)
tr_() { timeout 120 "$SEQPAR" train "${M[@]}" "$@" >"$T/tr.out" 2>&1 || bad "train $*: $(tail -n 1 "$T/tr.out")"; }
tr_ --data "$T/sh" --steps 6 --eval-every 3 --save "$T/full" --log "$T/full.jsonl"
tr_ --data "$T/sh" --steps 6 --eval-every 3 --stop-at 3 --save "$T/part" --log "$T/part.jsonl"
# a copy of this step-3 checkpoint and its log: the same command again (--save mv, mv2 below) would
# write the same files (a checkpoint holds no path of its own); those cases start from the copy
cp -r "$T/part" "$T/at3" && cp "$T/part.jsonl" "$T/at3.jsonl"
at3() { # DIR: the step-3 checkpoint and its log at DIR and DIR.jsonl (made again if the copy is missing)
    if [ -f "$T/at3/trainer_state.json" ]; then cp -r "$T/at3" "$1" && cp "$T/at3.jsonl" "$1.jsonl"
    else tr_ --data "$T/sh" --steps 6 --eval-every 3 --stop-at 3 --save "$1" --log "$1.jsonl"; fi
}
shard_at3=$(sed -nE 's/.*"data_shard": "0x0*([0-9a-f]+)".*/\1/p' "$T/part/trainer_state.json")
tr_ --data "$T/sh" --steps 6 --eval-every 3 --resume "$T/part" --save "$T/part" --log "$T/part.jsonl"
# 3 steps x 2 x 64 tokens from 300-token shards: the cursor is in shard 1 at step 3
if [ "$shard_at3" = 1 ] && same_losses "$T/full.jsonl" "$T/part.jsonl" && [ "$(losses "$T/full.jsonl" | wc -l)" -eq 6 ]; then ok; else
    bad "shards: 3 steps + resume + 3 differ from 6 (data_shard at step 3: '$shard_at3')"; fi
if cmp -s "$T/full/model.safetensors" "$T/part/model.safetensors"; then ok; else bad "shards: resumed weights are not bit-identical"; fi
# validation: the directory's _val_ shard, every 3 steps and at the end, in the log
if [ "$(val_losses "$T/full.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" = "3 6 " ] && grep -q "val loss" "$T/tr.out" &&
    [ "$(val_losses "$T/full.jsonl")" = "$(val_losses "$T/part.jsonl")" ]; then ok; else bad "val loss lines: $(val_losses "$T/full.jsonl" | tr '\n' ' ') / $(val_losses "$T/part.jsonl" | tr '\n' ' ')"; fi
# a quoted glob names the same shards; the concatenated tokens as one file give the same losses
tr_ --data "$T/sh/data_train_*.bin" --steps 6 --log "$T/glob.jsonl" --eval-every 0 --val-data "$T/sh"
if same_losses "$T/full.jsonl" "$T/glob.jsonl"; then ok; else bad "glob: losses differ from the directory's"; fi
$PY - "$T/sh" "$T/one.bin" <<'EOF'
import struct, sys, glob
toks = []
for p in sorted(glob.glob(sys.argv[1] + "/data_train_*.bin")):
    b = open(p, "rb").read()
    n = struct.unpack("<i", b[8:12])[0]
    toks += struct.unpack("<%dH" % n, b[1024:1024 + 2 * n])
open(sys.argv[2], "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack("<%dH" % len(toks), *toks))
EOF
tr_ --data "$T/one.bin" --vocab 257 --steps 6 --log "$T/one.jsonl"
if same_losses "$T/full.jsonl" "$T/one.jsonl"; then ok; else bad "shards: losses differ from the same tokens in one file"; fi
# a checkpoint from before data_shard existed (single file) still resumes bit-identically
tr_ --data "$T/one.bin" --vocab 257 --steps 6 --stop-at 4 --save "$T/old" --log "$T/old.jsonl"
"$EDIT" "$T/old/trainer_state.json" data_shard --delete
tr_ --data "$T/one.bin" --vocab 257 --steps 6 --resume "$T/old" --log "$T/old.jsonl"
if ! grep -q '"data_shard"' "$T/old/trainer_state.json" && same_losses "$T/one.jsonl" "$T/old.jsonl"; then ok; else bad "a checkpoint without data_shard does not resume bit-identically: $(losses "$T/one.jsonl" | tr "\n" " ") / $(losses "$T/old.jsonl" | tr "\n" " ") $(grep -c data_shard "$T/old/trainer_state.json")"; fi
# the same shards moved elsewhere and named another way (node-local scratch, a job that cds
# elsewhere: "--data ./sh" or "sh/" was refused as other data) resume bit-identically; a shard
# rewritten with as many other tokens is refused (it was accepted)
at3 "$T/mv"
cp -r "$T/sh" "$T/moved"
ABS_SEQPAR="$(cd "$(dirname "$SEQPAR")" && pwd)/$(basename "$SEQPAR")"
( cd "$T" && timeout 120 "$ABS_SEQPAR" train "${M[@]}" --data ./moved/ --steps 6 --eval-every 3 --resume "$T/mv" --log "$T/mv.jsonl" >"$T/mv.out" 2>&1 ) ||
    bad "resume on the moved shards: $(tail -n 1 "$T/mv.out")"
if same_losses "$T/full.jsonl" "$T/mv.jsonl"; then ok; else bad "resume on the moved shards: losses differ from the uninterrupted run"; fi
# ... on 2 ranks too: rank 0 alone reads the shards for the fingerprint and sends it (every rank read
# 8 KiB of every shard); a rank without it would refuse the resume
( mpi_test_env
  run_np 2 "$SEQPAR" train "${M[@]}" --cp 2 --data "$T/sh" --steps 6 --log "$T/r2full.jsonl" >"$T/r2.out" 2>&1 &&
  run_np 2 "$SEQPAR" train "${M[@]}" --cp 2 --data "$T/sh" --steps 6 --stop-at 3 --save "$T/r2" --log "$T/r2.jsonl" >>"$T/r2.out" 2>&1 &&
  cp -r "$T/sh" "$T/moved2" &&
  run_np 2 "$SEQPAR" train "${M[@]}" --cp 2 --data "$T/moved2" --steps 6 --resume "$T/r2" --log "$T/r2.jsonl" >>"$T/r2.out" 2>&1 ) ||
    bad "2 ranks, resume on moved shards: $(tail -n 2 "$T/r2.out")"
if same_losses "$T/r2full.jsonl" "$T/r2.jsonl" && [ "$(losses "$T/r2.jsonl" | wc -l)" -eq 6 ]; then ok; else bad "2 ranks, resume on the moved shards: losses differ from the uninterrupted run"; fi
at3 "$T/mv2"
$PY -c "
import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[1030] = (b[1030] + 1) % 200; open(p, 'wb').write(b)" "$T/moved/data_train_000000.bin"
expect_error "resume on a shard rewritten, same size" "was trained on other token files" "$SEQPAR" train "${M[@]}" --data "$T/moved" --steps 6 --resume "$T/mv2" --log "$T/x.jsonl"
# resuming with other data is refused: another shard in the directory, a cursor outside the data
cp "$T/sh/data_train_000000.bin" "$T/sh/data_train_000099.bin"
expect_error "resume with a shard added" "data_shards" "$SEQPAR" train "${M[@]}" --data "$T/sh" --steps 6 --resume "$T/part" --log "$T/x.jsonl"
rm "$T/sh/data_train_000099.bin"
cp -r "$T/part" "$T/far"
"$EDIT" "$T/far/trainer_state.json" data_shard '"0x0000000000000063"'
expect_error "resume at a shard beyond the data" "shard 99" "$SEQPAR" train "${M[@]}" --data "$T/sh" --steps 6 --resume "$T/far" --log "$T/x.jsonl"

# ---- validation loss: the same at 1, 2 and 4 ranks under several strategies (forward only)
mpi_test_env
V=(--data "$T/sh/data_train_*.bin" --val-data "$T/sh" --steps 2 --eval-every 1 --eval-batches 2 --batch 2)
tr_ "${V[@]}" --log "$T/v1.jsonl"
for grid in "--cp 2" "--hp 2" "--dp 2 --zero 3" "--strategy lightseq --cp 2 --layout contiguous" "--strategy fpdt --hp 2 --chunks 2" "--hp 2 --cp 2"; do
    case "$grid" in "--hp 2 --cp 2") np=4 ;; *) np=2 ;; esac
    run_np "$np" "$SEQPAR" train "${M[@]}" "${V[@]}" $grid --log "$T/vn.jsonl" >"$T/vn.out" 2>&1 || bad "val $grid: $(tail -n 1 "$T/vn.out")"
    # fp32 sums in another order over ranks: 1e-7 relative (seen: at most 1.2e-9)
    if close_lists "$(val_losses "$T/v1.jsonl")" "$(val_losses "$T/vn.jsonl")" 1e-7 &&
        [ "$(val_losses "$T/v1.jsonl" | wc -l)" -eq 2 ]; then ok; else
        bad "val loss at $np ranks ($grid): $(val_losses "$T/vn.jsonl" | tr '\n' ' ') vs 1 rank $(val_losses "$T/v1.jsonl" | tr '\n' ' ')"; fi
    rm -f "$T/vn.jsonl"
done
# validation must not change training: the same losses with and without it
tr_ --data "$T/sh/data_train_*.bin" --steps 2 --batch 2 --eval-every 0 --log "$T/nv.jsonl"
if same_losses "$T/v1.jsonl" "$T/nv.jsonl"; then ok; else bad "validation changed the training losses"; fi

# ---- bad data input: one line, non-zero exit
mkdir -p "$T/empty" "$T/onlyval"
cp "$T/sh/data_val_000000.bin" "$T/onlyval/"
expect_error "--data: empty directory" "no .bin token shards" "$SEQPAR" train "${M[@]}" --data "$T/empty" --steps 1 --log "$T/x.jsonl"
expect_error "--data: only held-out shards" "only held-out" "$SEQPAR" train "${M[@]}" --data "$T/onlyval" --steps 1 --log "$T/x.jsonl"
expect_error "--data: glob matching nothing" "matches no files" "$SEQPAR" train "${M[@]}" --data "$T/sh/nothing_*.bin" --steps 1 --log "$T/x.jsonl"
expect_error "--val-data with recall" "--val-data needs token data" "$SEQPAR" train "${M[@]}" --val-data "$T/sh" --steps 1 --log "$T/x.jsonl"
expect_error "--val-data missing" "no_val" "$SEQPAR" train "${M[@]}" --data "$T/sh" --val-data "$T/no_val.bin" --steps 1 --log "$T/x.jsonl"
head -c 1100 "$T/sh/data_val_000000.bin" > "$T/short_val.bin"
printf '\x26\x00\x00\x00' | dd of="$T/short_val.bin" bs=1 seek=8 conv=notrunc status=none # count 38
# validation on training data (a training shard as --val-data, a glob that takes in the _val_ shard
# it is validated on) and an llm.c shard read with --tokens-format text (trained on its raw bytes,
# header included): refused, by train and by memory
expect_error "--val-data = a training shard" "--val-data and --data share" "$SEQPAR" train "${M[@]}" --data "$T/sh" --val-data "$T/sh/data_train_000000.bin" --steps 1 --log "$T/x.jsonl"
expect_error "--data glob with the _val_ shard, validated on it" "--val-data and --data share" "$SEQPAR" train "${M[@]}" --data "$T/sh/*.bin" --val-data "$T/sh/data_val_000000.bin" --steps 1 --log "$T/x.jsonl"
expect_error "memory: --val-data = a training shard" "--val-data and --data share" "$SEQPAR" memory "${M[@]}" --data "$T/sh" --val-data "$T/sh/data_train_000000.bin"
expect_error "--tokens-format text on llm.c shards" "is an llm.c token shard" "$SEQPAR" train "${M[@]}" --data "$T/sh" --tokens-format text --steps 1 --log "$T/x.jsonl"
# a validation token outside the vocabulary: refused before step 1 (it ended the run at the first
# evaluation, --eval-every steps of training later)
expect_error "--val-data: a token above the vocabulary, at start-up" "holds token 256 but the model's vocab_size is 61" "$SEQPAR" train --model "$FIX/tiny_mha" --data "$FIX/tiny_mha/tokens.bin" --val-data "$T/sh/data_val_000000.bin" --seq-len 16 --batch 1 --steps 100 --eval-every 50 --log "$T/vv.jsonl"
if ! grep -q '"loss"' "$T/vv.jsonl" 2>/dev/null; then ok; else bad "--val-data out of the vocabulary: steps trained before the refusal"; fi
expect_error "--val-data shorter than a sequence" "fewer than one sequence" "$SEQPAR" train "${M[@]}" --data "$T/sh" --val-data "$T/short_val.bin" --steps 1 --log "$T/x.jsonl"
expect_error "--data: a token above the model's vocabulary" "vocab_size is 64" "$SEQPAR" train --model "$FIX/tiny_long" --data "$T/sh" --seq-len 16 --steps 1 --log "$T/x.jsonl"

# ---- sample: transformers' greedy continuation (generate.json) from the fixtures
gen_field() { $PY -c "import json, sys; g = json.load(open(sys.argv[1])); print(','.join(map(str, g[sys.argv[2]])) if isinstance(g[sys.argv[2]], list) else g[sys.argv[2]])" "$FIX/$1/generate.json" "$2"; }
for f in tiny_bytes tiny_mha tiny_gqa_tied tiny_llama3 tiny_qwen2 tiny_attn_bias tiny_qwen3 tiny_qwen3_bias; do
    got=$(timeout 60 "$SEQPAR" sample --model "$FIX/$f" --prompt-tokens "$(gen_field $f prompt)" --max-new-tokens "$(gen_field $f max_new_tokens)" --temperature 0 --ids 2>/dev/null)
    if [ -n "$got" ] && [ "$got" = "$(gen_field $f greedy)" ]; then ok; else bad "sample $f: greedy '$got', transformers '$(gen_field $f greedy)'"; fi
    # and under transformers' repetition_penalty (each token of the prompt and the output penalised)
    got=$(timeout 60 "$SEQPAR" sample --model "$FIX/$f" --prompt-tokens "$(gen_field $f prompt)" --max-new-tokens "$(gen_field $f max_new_tokens)" \
        --temperature 0 --repetition-penalty "$(gen_field $f repetition_penalty)" --ids 2>/dev/null)
    if [ -n "$got" ] && [ "$got" = "$(gen_field $f greedy_repetition_penalty)" ]; then ok; else
        bad "sample $f --repetition-penalty: greedy '$got', transformers '$(gen_field $f greedy_repetition_penalty)'"; fi
done
# a byte-level model takes and prints text: the same continuation as text
got=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "ROMEO:" --max-new-tokens 48 --temperature 0 2>/dev/null)
want=$($PY -c "import json; g = json.load(open('$FIX/tiny_bytes/generate.json')); print(bytes(g['prompt'] + g['greedy']).decode())")
if [ "$got" = "$want" ]; then ok; else bad "sample text: '$got' vs '$want'"; fi
# and the same prompt given as token ids prints the same text (it crashed: the prompt text was NULL)
got=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt-tokens "$(gen_field tiny_bytes prompt)" --max-new-tokens 48 --temperature 0 2>/dev/null)
if [ -n "$got" ] && [ "$got" = "$want" ]; then ok; else bad "sample --prompt-tokens on a byte-level model: '$got' vs '$want'"; fi
# sampling: the same seed gives the same text, top-k 1 is greedy at any temperature
S1=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "A" --max-new-tokens 40 --seed 5 2>/dev/null)
S2=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "A" --max-new-tokens 40 --seed 5 2>/dev/null)
S3=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "A" --max-new-tokens 40 --seed 6 2>/dev/null)
G1=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "A" --max-new-tokens 40 --temperature 0 2>/dev/null)
K1=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "A" --max-new-tokens 40 --temperature 2 --top-k 1 2>/dev/null)
if [ -n "$S1" ] && [ "$S1" = "$S2" ] && [ "$S1" != "$S3" ] && [ "$G1" = "$K1" ]; then ok; else bad "sample seeds / top-k 1: '$S1' '$S2' '$S3' '$G1' '$K1'"; fi
# a model trained on byte-level shards (vocabulary 257) samples text and stops at end-of-text
if timeout 60 "$SEQPAR" sample --model "$T/full" --prompt "The " --max-new-tokens 20 >"$T/s.out" 2>"$T/s.err" && grep -q '^The ' "$T/s.out" &&
    grep -q "generated" "$T/s.err"; then ok; else bad "sample from a shard-trained checkpoint: $(cat "$T/s.out" "$T/s.err")"; fi
expect_error "sample: text prompt to a tokenized model" "--prompt-tokens" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt "hi"
expect_error "sample: no model" "--model DIR is required" "$SEQPAR" sample --prompt "hi"
expect_error "sample: token outside the vocabulary" "outside the vocabulary" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens "1,61"
expect_error "sample: --stop-token = vocab_size" "--stop-token 61 is outside the vocabulary .*(vocab_size 61): give an id from 0 to 60, or -1" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens 1 --stop-token 61
if timeout 60 "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens 1 --stop-token 60 --max-new-tokens 2 >/dev/null 2>&1; then ok; else bad "sample --stop-token 60 (the last id of vocab_size 61) refused"; fi
expect_error "sample: bad token list" "comma" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens "1,x"
for ids in "1,,2" "1,2," ",1" "1 2"; do # an empty or missing entry is not skipped silently
    expect_error "sample: token list '$ids'" "separated by commas" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens "$ids"
done
expect_error "sample: --top-p 0" "keeps no token" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens 1 --top-p 0
expect_error "sample: --top-p above 1" "top-p" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens 1 --top-p 1.5
expect_error "sample: --repetition-penalty 0" "above 0" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt-tokens 1 --repetition-penalty 0
# a tiny --top-p keeps the most likely token only: greedy at any temperature
P1=$(timeout 60 "$SEQPAR" sample --model "$FIX/tiny_bytes" --prompt "A" --max-new-tokens 40 --temperature 2 --top-p 1e-9 2>/dev/null)
if [ -n "$P1" ] && [ "$P1" = "$G1" ]; then ok; else bad "sample --top-p 1e-9: '$P1', greedy '$G1'"; fi
expect_error "sample: both prompts" "exactly one" "$SEQPAR" sample --model "$FIX/tiny_mha" --prompt a --prompt-tokens 1
if timeout 20 "$SEQPAR" sample --help | grep -q "usage: seqpar sample"; then ok; else bad "seqpar sample --help"; fi

summary test_data
