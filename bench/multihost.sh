#!/usr/bin/env bash
# Multi-host seqpar runs on one machine, the way a cluster runs them: `mpirun --hostfile` over
# HOSTS "hosts" that are Linux network namespaces (iproute2), each with its own host name (a UTS
# namespace) and an address 10.231.0.N, joined by veth links to a bridge in a "switch" namespace.
# Open MPI uses TCP between hosts and shared memory (vader) inside each; its rsh agent is
# bench/netns_agent.sh, which enters the host's namespace instead of ssh-ing to it. Each host's
# link is shaped with a tbf qdisc to RATE (a slow network; this kernel has no netem, so no added
# latency). Only addresses inside those namespaces are used; everything is removed on exit.
#
#   bench/multihost.sh [BUILD] [placement|linkdown|all]      (root; default: build all)
#   bench/multihost.sh BUILD source FILE
#
#   source:    sets up the hosts, then sources FILE (with BUILD as its argument) in this shell, where
#              mh_mpirun LIMIT_S ARGS... starts ARGS on every host's SLOTS ranks (bench/sim_vs_measured.sh
#              runs its two-host settings so)
#   placement: 4 ranks (2 hosts x 2 slots), hp 2 x cp 2. head-first keeps each head group's
#              all-to-all on one host and sends the ring across the slow link; context-first the
#              opposite. Prints, per placement, the inter-host bytes per rank that --stats counts
#              and the step time (the slowest rank's, as logged), so the two can be compared.
#   linkdown:  the same run; after 3 steps host 1's link is taken down. The watchdog
#              (--comm-timeout COMM_TIMEOUT) ends the job: prints the watchdog lines, the exit
#              status and the seconds from link-down to mpirun's exit. Fails (exit 1) unless the
#              job ended non-zero within COMM_TIMEOUT + 10 s with at least one watchdog line.
#              mpirun notices a lost host only through TCP keepalive on its own control
#              connections (Open MPI's default: 300 s + 9 x 20 s), so this sets
#              oob_tcp_keepalive_time to COMM_TIMEOUT + 3 s: the ranks' watchdog fires first and
#              mpirun then gives up on the unreachable host within a few seconds; each host's
#              net.ipv4.tcp_retries2 is 2 (the default 15 retransmits unacknowledged data, such as
#              mpirun's kill order to the lost host, for about 15 minutes). On a real cluster set
#              the same (see the printed mpirun line).
# Environment: HOSTS (2..4, default 2), SLOTS (ranks per host, 2), RATE (tbf rate, 20mbit), BURST (tbf
# bucket, 32kbit: above about 100mbit the bucket must hold RATE x a timer tick, else tbf sends less),
# COMM_TIMEOUT (seconds, 5), SEQPAR_NS_PREFIX (namespace names, default sp<pid>).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
MODE=${2:-all}
SEQPAR=$ROOT/$BUILD/seqpar
AGENT=$ROOT/bench/netns_agent.sh
HOSTS=${HOSTS:-2}
SLOTS=${SLOTS:-2}
RATE=${RATE:-20mbit}
BURST=${BURST:-32kbit}
COMM_TIMEOUT=${COMM_TIMEOUT:-5}
export SEQPAR_NS_PREFIX=${SEQPAR_NS_PREFIX:-sp$$h}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
P=$SEQPAR_NS_PREFIX
SW=${P}sw

die() { echo "multihost: $*" >&2; exit 1; }
[ -x "$SEQPAR" ] || die "$SEQPAR is missing: run 'make' first"
[ "$(id -u)" -eq 0 ] || die "needs root (ip netns, tc)"
command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null || die "needs iproute2 (ip, tc) and unshare"
[ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 4 ] || die "HOSTS must be 2 to 4"

W=$(mktemp -d)
cleanup() {
    local i
    for i in $(seq 0 $((HOSTS - 1))); do ip netns del "$P$i" 2>/dev/null; done
    ip netns del "$SW" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # (a timeout's SIGTERM) still runs the EXIT trap

# ---- the hosts: namespace P<i> with eth0 = 10.231.0.<i+1>, its peer p<i> on bridge br0 in SW
echo "multihost: setting up $HOSTS hosts"
ip netns add "$SW" || die "cannot create network namespace $SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
: >"$W/hosts"
for i in $(seq 0 $((HOSTS - 1))); do
    ip netns add "$P$i" || die "cannot create network namespace $P$i"
    ip -n "$P$i" link set lo up
    # give up on unacknowledged TCP data after ~1.5 s (default ~15 min): mpirun's kill messages to
    # a host whose link is down would otherwise be retransmitted for that long (per-namespace
    # setting, as a cluster's hosts would set it)
    ip netns exec "$P$i" sysctl -qw net.ipv4.tcp_retries2=2
    ip -n "$SW" link add "p$i" type veth peer name eth0 netns "$P$i"
    ip -n "$SW" link set "p$i" master br0 up
    ip -n "$P$i" addr add "10.231.0.$((i + 1))/24" dev eth0
    ip -n "$P$i" link set eth0 up
    # the host's outgoing traffic (and, on the switch port, its incoming traffic) at RATE
    ip netns exec "$P$i" tc qdisc add dev eth0 root tbf rate "$RATE" burst "$BURST" latency 400ms
    ip netns exec "$SW" tc qdisc add dev "p$i" root tbf rate "$RATE" burst "$BURST" latency 400ms
    echo "10.231.0.$((i + 1)) slots=$SLOTS" >>"$W/hosts"
done
echo "multihost: $HOSTS hosts (namespaces ${P}0..$P$((HOSTS - 1))), $SLOTS ranks each, links shaped to $RATE"

NP=$((HOSTS * SLOTS))
# mpirun on host 0, under its own host name, as a login node would start it: mh_mpirun LIMIT_S ARGS...
# The ranks are not bound to cores: every namespace host's daemon would bind its rank i to core i,
# so that rank i of every host would share one core of this machine while another core idles.
mh_mpirun() {
    local limit=$1
    shift
    timeout "$limit" ip netns exec "${P}0" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "${P}0-host" \
        mpirun --bind-to none --hostfile "$W/hosts" -np "$NP" --mca plm_rsh_agent "$AGENT" --mca btl self,vader,tcp \
        --mca btl_tcp_if_include 10.231.0.0/24 --mca oob_tcp_if_include 10.231.0.0/24 \
        --mca oob_tcp_keepalive_time $((COMM_TIMEOUT + 3)) --mca oob_tcp_keepalive_intvl 1 \
        --mca oob_tcp_keepalive_probes 3 -x OMP_NUM_THREADS=1 "$@"
}
MODEL=(--layers 1 --hidden 128 --heads 16 --kv-heads 2 --ffn 64 --vocab 64 --seq-len 4096 --batch 1 --eval-every 0
       --eval-seqs 1 --peak-gflops 100 --quiet --hp 2 --cp $((NP / 2)))
status=0

if [ "$MODE" = source ]; then
    [ -n "${3:-}" ] && [ -r "$3" ] || die "source needs a readable FILE"
    # shellcheck disable=SC1090
    . "$3" "$BUILD"
    exit $?
fi

if [ "$MODE" = placement ] || [ "$MODE" = all ]; then
    echo "placement over the slow link (hp 2 x cp $((NP / 2)), $NP ranks, $SLOTS per host, $RATE):"
    printf '  %-14s %-34s %-26s %s\n' placement "inter-host MB sent/rank (--stats)" "step s (slowest rank)" "exposed comm s (max rank)"
    for pl in head-first context-first; do
        rm -f "$W/p.jsonl"
        if ! mh_mpirun 300 "$SEQPAR" train "${MODEL[@]}" --steps 3 --placement "$pl" --stats \
            --log "$W/p.jsonl" >"$W/p.out" 2>&1; then
            echo "  $pl: run failed: $(tail -n 3 "$W/p.out")"
            status=1
            continue
        fi
        inter=$(grep '^rank ' "$W/p.out" | awk '{ s = 0; for (i = 1; i <= NF; i++) if ($i == "inter") { v = $(i + 1); sub(/\)/, "", v); s += v } print s }' |
            sort -g | awk '{ a[NR] = $1 } END { printf "%.3f (min) .. %.3f (max)", a[1], a[NR] }')
        step=$(sed -nE 's/.*"step": ([0-9]+),.*"step_seconds": ([0-9.]+).*/\2/p' "$W/p.jsonl" | tail -n 2 | sort -g | tail -n 1)
        exposed=$(sed -nE 's/.*exposed comm ([0-9.]+) s.*/\1/p' "$W/p.out" | sort -g | tail -n 1)
        printf '  %-14s %-34s %-26s %s\n' "$pl" "$inter" "$step" "$exposed"
        grep '^rank 0:' "$W/p.out" | sed -E 's/ \(cpu[^)]*\)//; s/^/    /'
    done
fi

if [ "$MODE" = linkdown ] || [ "$MODE" = all ]; then
    rm -f "$W/l.jsonl"
    # a lighter sequence: steps of a fraction of a second even on a loaded machine
    mh_mpirun 60 "$SEQPAR" train "${MODEL[@]}" --seq-len 512 --steps 100000 --comm-timeout "$COMM_TIMEOUT" \
        --log "$W/l.jsonl" >"$W/l.out" 2>&1 &
    tp=$!
    for _ in $(seq 1 300); do
        [ "$(cat "$W/l.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
        kill -0 $tp 2>/dev/null || break
        sleep 0.1
    done
    t0=$(date +%s.%N)
    ip -n "${P}1" link set eth0 down
    wait $tp
    rc=$?
    el=$(echo "$(date +%s.%N) - $t0" | bc)
    n=$(grep -c '^seqpar: error: watchdog: ' "$W/l.out")
    echo "link down: host 1's link taken down after step $(cat "$W/l.jsonl" | wc -l); mpirun exited with status $rc" \
         "${el} s later (--comm-timeout $COMM_TIMEOUT); $n watchdog line(s):"
    grep '^seqpar: error: watchdog: ' "$W/l.out" | sed 's/^/  /'
    if [ "$(cat "$W/l.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; then
        echo "link down: FAILED: the run logged fewer than 3 steps in 30 s"
        tail -n 20 "$W/l.out" | sed 's/^/  | /'
        status=1
    elif [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$n" -lt 1 ] || ! awk -v e="$el" -v t="$COMM_TIMEOUT" 'BEGIN { exit !(e <= t + 10) }'; then
        echo "link down: FAILED (expected a non-zero exit within $COMM_TIMEOUT + 10 s with a watchdog line)"
        tail -n 20 "$W/l.out" | sed 's/^/  | /'
        status=1
    fi
fi
echo "mpirun line used: mpirun --bind-to none --hostfile HOSTS --mca btl self,vader,tcp --mca btl_tcp_if_include NET" \
     "--mca oob_tcp_if_include NET --mca oob_tcp_keepalive_time $((COMM_TIMEOUT + 3)) --mca oob_tcp_keepalive_intvl 1" \
     "--mca oob_tcp_keepalive_probes 3 ... seqpar train --comm-timeout $COMM_TIMEOUT ..."
exit $status
