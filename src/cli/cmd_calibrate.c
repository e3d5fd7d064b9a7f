/* seqpar calibrate: measures this machine (or the hosts mpirun started it on) into a cluster file for
 * the step simulator (plan/cluster.h): the attention kernel's rate on blocks of several sizes and the
 * fp32 GEMM's on products of several sizes with every rank computing at once, a message's latency
 * and bandwidth between two ranks of a node, a node's throughput with all its ranks exchanging at
 * once, and between nodes a message's latency and the NICs' bandwidth with every rank exchanging
 * across nodes at once; the threads and memory of a rank from the job. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench/calibrate.h"
#include "bench/sgemm_bench.h"
#include "kernels/bf16.h"
#include "cli/commands.h"
#include "core/common.h"
#include "plan/cluster.h"
#include "train/cli_common.h"

static const char HELP[] =
    "usage: mpirun -np P seqpar calibrate [--out FILE | --save] [--nics-per-node N] [--rows LIST] [--heads H]\n"
    "                                     [--head-dim D] [--gemm-sizes LIST] [--repeats N] [--name NAME]\n"
    "\n"
    "Measures this machine into a cluster file for 'seqpar strategies --schedule NAME --cluster FILE':\n"
    "the attention kernel's forward rate on fully visible square blocks of each --rows size and on causal\n"
    "diagonal blocks of that size (every rank computing at once, one thread a rank unless OMP_NUM_THREADS\n"
    "says otherwise; each trial the kernel again and again for 0.1 s, so that ranks sharing cores get\n"
    "their share within it) and the backward's time over the forward's; the fp32 GEMM's rate on square\n"
    "products of each --gemm-sizes size (the same way; bf16's too: the same products where bf16 runs on\n"
    "fp32's sgemm, else the bf16 GEMM at 2048); a rank's memory bandwidth (STREAM's triad on 64 MiB\n"
    "arrays, every rank at once: the optimizer step's rate); a message's one-way latency (8 bytes) and\n"
    "bandwidth (--message-mib; the fastest round trip: the slower ones waited for a rank whose core\n"
    "another ran) between the first two ranks of a node, and of every rank of the first node\n"
    "exchanging with a partner at once; with ranks on two or more nodes, the latency between rank 0 and\n"
    "the first rank of another node, and a NIC's bandwidth by the flows through it (nic_flows): one pair\n"
    "exchanging --message-mib both ways, and every rank with every rank of the other nodes at once (the\n"
    "load of the collectives and all-to-alls), each over the trials' mean time. Nodes and ranks per\n"
    "node are the MPI job's (ranks sharing memory); threads\n"
    "per rank its OpenMP threads; a rank's memory this host's RAM over its ranks; the slow tier (disk)\n"
    "is not measured (0).\n"
    "\n"
    "  --out FILE        write the cluster file here (default: print it)\n"
    "  --save            write it where the cluster preset this-machine reads it (the default cluster;\n"
    "                    $SEQPAR_THIS_MACHINE, else ~/.config/seqpar/this-machine.json)\n"
    "  --nics-per-node N the NICs a node's ranks share (not measurable from here; default 1); the\n"
    "                    measured inter-node bandwidth is one NIC's\n"
    "  --rows LIST       block sizes for the attention rate (default 128,512,2048)\n"
    "  --heads H         heads of those blocks (default 8)\n"
    "  --head-dim D      head dimension (default 64)\n"
    "  --gemm-sizes LIST square GEMM sizes for the GEMM rate (default 256,1024,2048)\n"
    "  --message-mib M   the bandwidth messages' size in MiB (default 16)\n"
    "  --repeats N       repeats of each measurement, medians kept (default 5)\n"
    "  --name NAME       the cluster's name in the file (default: this host's name)\n";

/* A comma-separated list of up to CLUSTER_RATE_POINTS increasing sizes from lo to hi into v. */
static void sizes_list(const char *cmd, const char *flag, const char *arg, long lo, long hi, const char *what,
                       const char *example, int *v, int *n) {
    *n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        const long r = strtol(p, &end, 10);
        if (end == p || r < lo || r > hi || (*end && *end != ',') || *n == CLUSTER_RATE_POINTS || (*n && r <= v[*n - 1]))
            die_collective("seqpar %s: --%s %s: give up to %d increasing %s of %ld to %ld, comma separated (e.g. %s)",
                           cmd, flag, arg, CLUSTER_RATE_POINTS, what, lo, hi, example);
        v[(*n)++] = (int)r;
        p = *end ? end + 1 : end;
    }
    if (!*n) die_collective("seqpar %s: --%s is empty: give sizes such as %s", cmd, flag, example);
}

/* mkdir -p of path's directory: 0, or -1 with errno. */
static int make_parent(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(dir, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int cmd_calibrate(int argc, char **argv) {
    const char *cmd = "calibrate", *out = NULL, *name = NULL, *rows_arg = "128,512,2048", *gemm_arg = "256,1024,2048";
    int nics = 1, heads = 8, head_dim = 64, repeats = 5, save = 0;
    double message_mib = 16;
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"nics-per-node", required_argument, 0, 'N'},
        {"rows", required_argument, 0, 'r'}, {"heads", required_argument, 0, 'H'},
        {"head-dim", required_argument, 0, 'd'}, {"repeats", required_argument, 0, 'R'},
        {"message-mib", required_argument, 0, 'm'}, {"name", required_argument, 0, 'n'},
        {"save", no_argument, 0, 's'}, {"gemm-sizes", required_argument, 0, 'g'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_full(argc, argv, ":h", opts, cmd)) != -1) {
        switch (opt) {
        case 'o': out = optarg; break;
        case 'N': nics = (int)parse_long(cmd, "nics-per-node", optarg, 1, 1024); break;
        case 'r': rows_arg = optarg; break;
        case 'H': heads = (int)parse_long(cmd, "heads", optarg, 1, 1024); break;
        case 'd': head_dim = (int)parse_long(cmd, "head-dim", optarg, 1, 1024); break;
        case 'R': repeats = (int)parse_long(cmd, "repeats", optarg, 1, 1000); break;
        case 'm': message_mib = parse_double(cmd, "message-mib", optarg, 1.0 / 1024, 1024); break;
        case 'n': name = optarg; break;
        case 's': save = 1; break;
        case 'g': gemm_arg = optarg; break;
        case 'h': fputs(HELP, stdout); return 0;
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    if (save && out) die_collective("seqpar %s: give --out FILE or --save, not both", cmd);
    char save_path[4096];
    if (save) out = cluster_this_machine_path(save_path, sizeof save_path);
    int rows[CLUSTER_RATE_POINTS], n_rows = 0, sizes[CLUSTER_RATE_POINTS], n_sizes = 0;
    sizes_list(cmd, "rows", rows_arg, 16, 65536, "block sizes", "128,512,2048", rows, &n_rows);
    sizes_list(cmd, "gemm-sizes", gemm_arg, 16, 8192, "GEMM sizes", "256,1024,2048", sizes, &n_sizes);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int rpn, node_rank, most, least;
    MPI_Comm_size(node, &rpn);
    MPI_Comm_rank(node, &node_rank);
    MPI_Allreduce(&rpn, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&rpn, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (most != least)
        die_collective("seqpar %s: the nodes run %d to %d ranks each: start the same number of ranks on every node "
                       "(mpirun --map-by ppr:N:node)", cmd, least, most);
    if (nics > rpn)
        die_collective("seqpar %s: --nics-per-node %d exceeds the %d ranks a node runs: a NIC serves at least one rank",
                       cmd, nics, rpn);

    Cluster c;
    memset(&c, 0, sizeof c);
    struct utsname un;
    snprintf(c.name, sizeof c.name, "%.63s", name ? name : (uname(&un) == 0 ? un.nodename : "this machine"));
    c.nodes = world / rpn;
    c.ranks_per_node = rpn;
    c.nics_per_node = nics;
    c.threads_per_rank = omp_get_max_threads();
    c.device_mem_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / rpn / 1073741824.0;
    c.intra_kind = CLUSTER_INTRA_SHARED_MEMORY; /* a node's ranks are the MPI job's ranks sharing memory */
    c.collectives = CLUSTER_COLLECTIVES_DIRECT; /* what runs here: seqpar's own collectives (parallel/comm.h) */
    c.attn.n = n_rows;
    double factor_sum = 0, causal_tflops[CLUSTER_RATE_POINTS] = {0};
    for (int i = 0; i < n_rows; i++) { /* every rank at once, as in training; the slowest rank's rate */
        MPI_Barrier(MPI_COMM_WORLD);
        double factor, tflops = calibrate_attention(rows[i], heads, head_dim, 0, repeats, &factor), slowest;
        MPI_Allreduce(&tflops, &slowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        c.attn.x[i] = rows[i];
        c.attn.tflops[i] = slowest;
        factor_sum += factor;
        /* and a causal diagonal block of the same rows (the rate the simulator gives a masked block) */
        MPI_Barrier(MPI_COMM_WORLD);
        double unused;
        tflops = calibrate_attention(rows[i], heads, head_dim, 1, repeats, &unused);
        MPI_Allreduce(&tflops, &causal_tflops[i], 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    }
    double factor_all;
    MPI_Allreduce(&factor_sum, &factor_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    c.attn_backward_factor = factor_all / n_rows / world;
    /* the same points as curves of their shape: fp32, head_dim, fully visible and causal */
    c.n_attn_curves = 2;
    for (int k = 0; k < 2; k++) {
        c.attn_curves[k] = (ClusterAttnCurve){.precision = PRECISION_FP32, .head_dim = head_dim, .causal = k,
                                              .rate = c.attn};
        if (k) memcpy(c.attn_curves[k].rate.tflops, causal_tflops, sizeof causal_tflops);
    }
    /* GEMMs: every rank at once, the slowest rank's rate; bf16 is fp32's sgemm on the conversion path */
    c.gemm[PRECISION_FP32].n = n_sizes;
    for (int i = 0; i < n_sizes; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double tflops = 1e-3 * sgemm_gflops(sizes[i], sizes[i], sizes[i], repeats, CALIBRATE_TRIAL_S), slowest;
        MPI_Allreduce(&tflops, &slowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        c.gemm[PRECISION_FP32].x[i] = sizes[i];
        c.gemm[PRECISION_FP32].tflops[i] = slowest;
    }
    if (bf16_products_on_sgemm()) {
        c.gemm[PRECISION_BF16] = c.gemm[PRECISION_FP32];
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        double tflops = bf16_gemm_peak_gflops(repeats < 3 ? 3 : repeats) * 1e-3, slowest;
        MPI_Allreduce(&tflops, &slowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        c.gemm[PRECISION_BF16] = (ClusterCurve){.n = 1, .x = {2048}, .tflops = {slowest}};
    }
    { /* memory: every rank at once (the optimizer step runs on all of them), the slowest rank's */
        MPI_Barrier(MPI_COMM_WORLD);
        double gbs = calibrate_memory_gbs((size_t)64 << 20, repeats), slowest;
        MPI_Allreduce(&gbs, &slowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        c.device_mem_gbs = slowest;
    }
    const size_t big = (size_t)(message_mib * 1048576.0);
    /* each rank's node (by its node's first world rank), as mpirun placed the ranks, so that the pairs
     * below are inside one node and across two whatever the mapping */
    int leader = rank, *node_of = xmalloc(sizeof(int) * (size_t)world);
    MPI_Bcast(&leader, 1, MPI_INT, 0, node);
    MPI_Allgather(&leader, 1, MPI_INT, node_of, 1, MPI_INT, MPI_COMM_WORLD);
    int other = -1, scattered = -1; /* the first rank on another node than rank 0's; one out of order */
    for (int r = 0; r < world; r++) {
        if (other < 0 && node_of[r] != node_of[0]) other = r;
        if (scattered < 0 && node_of[r] != node_of[r - r % rpn]) scattered = r;
    }
    if (scattered >= 0 && rank == 0) /* the measurements are right; the plans' numbering is not the job's */
        fprintf(stderr, "seqpar %s: note: mpirun placed rank %d on another node than rank %d: the simulator takes a "
                "node's ranks to be consecutive (rank r on node r / %d), so plans for this cluster number ranks "
                "otherwise than this job; start jobs with consecutive ranks a node (--map-by slot)\n",
                cmd, scattered, scattered - scattered % rpn, rpn);
    /* inside rank 0's node: its first two ranks, then all its ranks at once */
    int color = node_of[rank] == node_of[0] ? 0 : MPI_UNDEFINED;
    MPI_Comm first;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &first);
    double intra[3] = {0, 0, 0}; /* latency s, bandwidth GB/s, node total GB/s */
    if (first != MPI_COMM_NULL) {
        if (rpn >= 2) {
            intra[0] = calibrate_pingpong(first, 0, 1, 8, repeats * 20, 1);
            intra[1] = big / calibrate_pingpong(first, 0, 1, big, repeats, 1) / 1e9;
            intra[2] = calibrate_all_pairs_gbs(first, big, repeats, 1);
        }
        MPI_Comm_free(&first);
    }
    MPI_Request got; /* the other nodes' ranks wait asleep meanwhile (calibrate_wait_asleep) */
    MPI_Ibcast(intra, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD, &got);
    calibrate_wait_asleep(&got);
    c.intra_latency_us = 1e6 * intra[0];
    c.intra_gbs = rpn >= 2 ? intra[1] : 1e3; /* one rank a node: no traffic inside it to limit */
    /* a shared medium shows as a node total below its ranks' ports together */
    c.intra_node_gbs = rpn >= 2 && intra[2] < 0.9 * (rpn / 2 * 2) * intra[1] ? intra[2] : 0;
    double pair_gbs = 0, all_gbs = 0, all_flows = 1;
    if (other >= 0) {
        /* a message's latency: rank 0 and the first rank of another node. A NIC's bandwidth by the
         * flows through it: one pair exchanging both ways (rank 0 and that rank), then every rank
         * exchanging with every rank of the other nodes at once (the collectives' and all-to-alls'
         * load: each NIC's ranks times the ranks elsewhere flows each way), over the node's NICs */
        c.nic_latency_us = 1e6 * calibrate_pingpong(MPI_COMM_WORLD, 0, other, 8, repeats * 20, 1);
        int *pair = xmalloc(sizeof(int) * (size_t)world);
        for (int r = 0; r < world; r++) pair[r] = r == 0 ? 0 : r == other ? 1 : -1;
        pair_gbs = calibrate_cross_node_gbs(MPI_COMM_WORLD, pair, big, repeats);
        xfree(pair);
        all_gbs = calibrate_cross_node_gbs(MPI_COMM_WORLD, node_of, big, repeats) / nics;
        all_flows = (double)rpn / nics * (world - rpn);
        c.nic_gbs = fmax(pair_gbs, all_gbs);
        if (all_flows > 1) /* the NIC's total at 1 flow and at all of them (cluster_nic_gbs) */
            c.nic_flows = (ClusterCurve){.n = 2, .x = {1, all_flows}, .tflops = {pair_gbs, all_gbs}};
    }
    xfree(node_of);
    MPI_Comm_free(&node);
    char *bad = cluster_check(&c);
    if (bad) die_collective("seqpar %s: the measured cluster is not valid (%s): a measurement failed", cmd, bad);
    if (rank == 0) {
        char source[768], across[256] = "";
        if (other >= 0)
            snprintf(across, sizeof across, "; nic_flows: one pair exchanging both ways %.4g GB/s, every rank with "
                     "every rank of the other nodes at once (%g flows a NIC each way) %.4g GB/s a NIC, means of %d",
                     pair_gbs, all_flows, all_gbs, repeats);
        snprintf(source, sizeof source, "measured by seqpar calibrate on %d rank%s (%d node%s x %d), fp32 attention, "
                 "%d heads of %d, fp32 GEMM %s, memory by STREAM's triad, medians of %d; nics_per_node given (%d); host_mem_gib and d2h_gbs "
                 "(the disk) not measured%s", world, world == 1 ? "" : "s", c.nodes, c.nodes == 1 ? "" : "s", rpn, heads,
                 head_dim, bf16_products_on_sgemm() ? "(bf16: the same, on sgemm)" : "(bf16: its GEMM at 2048)", repeats,
                 nics, across);
        snprintf(c.description, sizeof c.description, "%s as seqpar calibrate measured it: %d node%s x %d ranks",
                 c.name, c.nodes, c.nodes == 1 ? "" : "s", rpn);
        SeqErr e;
        if (save && make_parent(out) != 0) die("seqpar %s: cannot make the directory of %s: %s", cmd, out, strerror(errno));
        if (cluster_save(out, &c, source, &e) != 0) die("seqpar %s: %s", cmd, e.msg);
        if (out) printf("wrote %s: %d node%s x %d ranks, attention %.3g to %.3g TFLOP/s, inside %.3g GB/s (%.3g us)%s\n",
                        out, c.nodes, c.nodes == 1 ? "" : "s", rpn, c.attn.tflops[0], c.attn.tflops[n_rows - 1],
                        c.intra_gbs, c.intra_latency_us, c.nodes >= 2 ? ", between nodes measured" : "");
    }
    return 0;
}
