#!/usr/bin/env bash
# Draws a training run's pictures from its JSONL log (seqpar train --log) with gnuplot:
#   OUTDIR/loss.png    training loss by step (log scale), and recall accuracy at each evaluation
#   OUTDIR/recall.png  recall accuracy by key-query distance: at the last evaluation (bars) and
#                      how each distance bucket rose during training (lines)
# Only the last run in the log is drawn (the records after its last "run_start" record).
# Usage: bash scripts/plot_run.sh LOG.jsonl [OUTDIR (default: the log's directory)]
# Without gnuplot (scripts/install-deps.sh installs it) it says so and draws nothing (exit 0).
set -euo pipefail
log=${1:?usage: bash scripts/plot_run.sh LOG.jsonl [OUTDIR]}
out=${2:-$(dirname "$log")}
[ -f "$log" ] || { echo "plot_run: no log '$log': give the train.jsonl of a run" >&2; exit 1; }
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "plot_run: gnuplot is not installed, so no PNG pictures were drawn (bash scripts/install-deps.sh installs it)"
    exit 0
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The last run's records, then "step loss" and, per evaluation, "step accuracy" and one
# "step from to accuracy correct total" line per distance bucket.
awk '/"run_start"/ { n = 0 } { line[++n] = $0 } END { for (i = 1; i <= n; i++) print line[i] }' "$log" >"$tmp/run.jsonl"
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
title=$(sed -nE 's/.*"run_start": "([^"]+)".*/run started \1/p' "$tmp/run.jsonl" | tail -n 1)

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
set key top right
plot '$tmp/loss.dat' using 1:2 with lines lw 1.5 lc rgb '#1b9e77' title 'training loss' $acc_plot
EOF
echo "plot_run: wrote $out/loss.png"

if [ -s "$tmp/buckets.dat" ]; then
    last=$(awk '{ s = $1 } END { print s }' "$tmp/buckets.dat")
    awk -v s="$last" '$1 == s { print $2 "-" $3, $4, $6 }' "$tmp/buckets.dat" >"$tmp/final.dat"
    # one block per distance bucket (for the lines), in order of distance
    sort -k2,2n -k1,1n "$tmp/buckets.dat" | awk 'NR > 1 && $2 != prev { print ""; print "" } { print; prev = $2 }' >"$tmp/series.dat"
    names=$(awk '{ print $2, $2 "-" $3 }' "$tmp/buckets.dat" | sort -un | awk '{ printf "%s ", $2 }')
    nb=$(printf '%s\n' $names | wc -l)
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
     '' using 0:(\$2 + 0.04):(sprintf('%.2f (n=%d)', \$2, \$3)) with labels font 'sans,9' notitle
set title 'during training'
unset xtics
set xtics
set xlabel 'step'
set key bottom right font 'sans,9'
set style data linespoints
plot for [i = 0:$nb - 1] '$tmp/series.dat' index i using 1:4 lw 1.5 pt 7 ps 0.6 \
     title word('$names', i + 1)
unset multiplot
EOF
    echo "plot_run: wrote $out/recall.png"
else
    echo "plot_run: the log holds no recall evaluations (not the recall task?): no recall.png"
fi
