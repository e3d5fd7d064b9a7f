# Sourced by bench/sample_ranks.sh and bench/sample_continue.sh (with BUILD set, run from the
# repository root): the MPI environment, a temporary directory $T removed at exit, the benchmarks'
# reference model (4 layers, hidden 256, 4 heads of 64, 2 KV heads, ffn 1024, vocabulary 256;
# random weights saved by one training step) in $T/model, and the repository's docs as one line of
# text in $T/text.txt.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2} OMPI_MCA_ess_singleton_isolated=1 SEQPAR_PEAK_GFLOPS=100
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/seqpar" train --data recall --layers 4 --hidden 256 --heads 4 --kv-heads 2 --ffn 1024 --vocab 256 --seq-len 64 \
    --steps 1 --save "$T/model" --log "$T/train.jsonl" >/dev/null 2>&1 || { echo "could not make the model"; exit 1; }
cat README.md docs/*.md | tr -c 'A-Za-z0-9 .,\n' ' ' | tr '\n' ' ' >"$T/text.txt"
echo "lscpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
