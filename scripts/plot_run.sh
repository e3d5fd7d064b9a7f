#!/usr/bin/env bash
# Draws a training run's pictures from its JSONL log (seqpar train --log) with gnuplot:
#   OUTDIR/loss.png    training loss by step (log scale), and recall accuracy at each evaluation
#   OUTDIR/recall.png  recall accuracy by key-query distance: at the last evaluation (bars) and
#                      how each distance bucket rose during training (lines)
# Of each log only its last run is drawn (the records after its last "run_start" record). Several
# logs are stages of one training (e.g. scripts/train.sh's growing sequence length): their steps
# are drawn one after the other, each stage marked with its --seq-len.
# Usage: bash scripts/plot_run.sh [-o OUTDIR] LOG.jsonl [LOG.jsonl ...]   (OUTDIR: the last log's
# directory by default)
# Without gnuplot (scripts/install-deps.sh installs it) it says so and draws nothing (exit 0).
set -euo pipefail
usage="usage: bash scripts/plot_run.sh [-o OUTDIR] LOG.jsonl [LOG.jsonl ...]"
out=""
if [ "${1:-}" = "-o" ]; then out=${2:?$usage}; shift 2; fi
[ $# -ge 1 ] || { echo "$usage" >&2; exit 1; }
for log in "$@"; do
    [ -f "$log" ] || { echo "plot_run: no log '$log': give the train.jsonl of a run" >&2; exit 1; }
done
[ -n "$out" ] || out=$(dirname "${@: -1}")
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "plot_run: gnuplot is not installed, so no PNG pictures were drawn (bash scripts/install-deps.sh installs it)"
    exit 0
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Each log's last run, its steps shifted to follow the previous log's; then "step loss" and, per
# evaluation, "step accuracy" and one "step from to accuracy correct total" line per distance bucket;
# "step seq-len" where each stage starts.
offset=0
: >"$tmp/run.jsonl"
: >"$tmp/stages.dat"
for log in "$@"; do
    awk '/"run_start"/ { n = 0 } { line[++n] = $0 } END { for (i = 1; i <= n; i++) print line[i] }' "$log" >"$tmp/one.jsonl"
    seq_len=$(sed -nE 's/.*"run_start".*"--seq-len", "([0-9]+)".*/\1/p' "$tmp/one.jsonl" | tail -n 1)
    echo "$offset ${seq_len:-?}" >>"$tmp/stages.dat"
    awk -v off="$offset" '/^\{"step": [0-9]+,/ { match($0, /[0-9]+/); $0 = "{\"step\": " (substr($0, RSTART, RLENGTH) + off) substr($0, RSTART + RLENGTH) }
                          { print }' "$tmp/one.jsonl" >>"$tmp/run.jsonl"
    last=$(sed -nE 's/^\{"step": ([0-9]+), "loss".*/\1/p' "$tmp/one.jsonl" | tail -n 1)
    offset=$((offset + ${last:-0}))
done
sed -nE 's/^\{"step": ([0-9]+), "loss": ([^,]+),.*/\1 \2/p' "$tmp/run.jsonl" >"$tmp/loss.dat"
awk '/"eval": "recall"/ {
        match($0, /"step": [0-9]+/); step = substr($0, RSTART + 8, RLENGTH - 8)
        match($0, /"accuracy": [0-9.eE+-]+/); print step, substr($0, RSTART + 12, RLENGTH - 12) > (dir "/acc.dat")
        rest = $0
        while (match(rest, /\{"from": [0-9]+, "to": [0-9a-z]+, "correct": [0-9]+, "total": [0-9]+\}/)) {
            b = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
            gsub(/[{}",:]/, " ", b); split(b, f, " ")   # from F to T correct C total N
            to = f[4] == "null" ? "+" : f[4]
            if (f[8] > 0) print step, f[2], to, f[6] / f[8], f[6], f[8] > (dir "/buckets.dat")
        }
     }' dir="$tmp" "$tmp/run.jsonl"
if [ ! -s "$tmp/loss.dat" ]; then echo "plot_run: '$log' holds no training steps: nothing to draw" >&2; exit 1; fi
touch "$tmp/acc.dat" "$tmp/buckets.dat"
title=$(sed -nE 's/.*"run_start": "([^"]+)".*/run started \1/p' "$tmp/run.jsonl" | head -n 1)
# a dashed line and the sequence length where each stage starts
marks=$(awk 'NR > 1 || $1 > 0 { printf "set arrow from first %s, graph 0 to first %s, graph 1 nohead dt 2 lc rgb \"gray40\"; ", $1, $1 }
             { printf "set label \"seq-len %s\" at first %s, graph 0.97 offset 0.5,0 font \",9\"; ", $2, $1 }' "$tmp/stages.dat")

if [ -s "$tmp/acc.dat" ]; then
    acc_plot=", '$tmp/acc.dat' using 1:2 axes x1y2 with linespoints lw 2 pt 7 lc rgb '#d95f02' title 'recall accuracy (right axis)'"
else
    acc_plot=""
fi
gnuplot <<EOF
set terminal pngcairo size 900,520 font 'sans,11'
set output '$out/loss.png'
set title 'training loss — $title'
set xlabel 'step'
set ylabel 'loss (cross-entropy on the answers, log scale)'
set logscale y
set y2label 'recall accuracy'
set y2range [0:1.05]
set y2tics 0.1
set ytics nomirror
set grid
set key center right
$marks
plot '$tmp/loss.dat' using 1:2 with lines lw 1.5 lc rgb '#1b9e77' title 'training loss' $acc_plot
EOF
echo "plot_run: wrote $out/loss.png"

if [ -s "$tmp/buckets.dat" ]; then
    last=$(awk '{ s = $1 } END { print s }' "$tmp/buckets.dat")
    awk -v s="$last" '$1 == s { print $2 "-" $3, $4, $6 }' "$tmp/buckets.dat" >"$tmp/final.dat"
    # one block per distance bucket (for the lines), in order of distance; points of fewer than 8
    # queries are left out of the lines (too noisy to follow)
    awk '$6 >= 8' "$tmp/buckets.dat" | sort -k2,2n -k1,1n | awk 'NR > 1 && $2 != prev { print ""; print "" } { print; prev = $2 }' >"$tmp/series.dat"
    names=$(awk '$6 >= 8 { print $2, $2 "-" $3 }' "$tmp/buckets.dat" | sort -un | awk '{ printf "%s ", $2 }')
    nb=$(printf '%s\n' $names | grep -c . || true)
    right=""
    if [ "$nb" -gt 0 ]; then # the lines panel
        right=$(cat <<EOF
set title 'during training'
unset xtics
set xtics
set xlabel 'step'
set xrange [0:*]
set key bottom right font 'sans,9'
$marks
set style data linespoints
plot for [i = 0:$nb - 1] '$tmp/series.dat' index i using 1:4 lw 1.5 pt 7 ps 0.6 \
     title word('$names', i + 1)
EOF
)
    fi
    gnuplot <<EOF
set terminal pngcairo size 1200,520 font 'sans,11'
set output '$out/recall.png'
set multiplot layout 1,2 title 'recall accuracy by key-query distance (tokens between the query and its key-value pair) — $title'
set title 'at the last evaluation (step $last)'
set style fill solid 0.8 border -1
set boxwidth 0.7
set yrange [0:1.1]
set ylabel 'accuracy'
set xlabel 'distance (tokens)'
set xtics rotate by -30
set grid y
plot '$tmp/final.dat' using 0:2:xtic(1) with boxes lc rgb '#7570b3' notitle, \
     '' using 0:(\$2 + 0.04):(sprintf('%.2f', \$2)) with labels font 'sans,9' notitle, \
     '' using 0:(0.05):(sprintf('n=%d', \$3)) with labels font 'sans,8' tc rgb 'white' notitle
$right
unset multiplot
EOF
    echo "plot_run: wrote $out/recall.png"
else
    echo "plot_run: the log holds no recall evaluations (not the recall task?): no recall.png"
fi
