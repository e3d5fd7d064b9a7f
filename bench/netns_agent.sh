#!/bin/sh
# Open MPI rsh agent for bench/multihost.sh (--mca plm_rsh_agent): instead of ssh-ing to HOST it
# runs the command inside the network namespace that stands for HOST. HOST is the address
# 10.231.0.N of namespace ${SEQPAR_NS_PREFIX}N-1 (set by multihost.sh). Open MPI calls it as
#   netns_agent.sh HOST COMMAND WORDS...
# and expects the words to be run by a shell, as ssh would. Only for that benchmark.
set -eu
host=$1
shift
prefix=${SEQPAR_NS_PREFIX:-sph}
case "$host" in
10.231.0.*) n=${host##*.} ;;
*) echo "netns_agent.sh: unknown host '$host' (expected 10.231.0.N)" >&2; exit 255 ;;
esac
# a UTS namespace too, so the host has its own name: Open MPI decides which ranks share a node
# (and so shared memory) partly by host name
ns=$prefix$((n - 1))
exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns-host && $*"
