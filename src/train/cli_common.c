/* Shared CLI helpers: see cli_common.h. */
#include "train/cli_common.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/config_json.h"
#include "io/param_io.h"
#include "kernels/bf16.h"
#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "kernels/sgemm.h"

long parse_long(const char *cmd, const char *flag, const char *value, long min, long max) {
    char *end = NULL;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || !end || *end || end == value || !is_decimal_number(value, 0))
        die_collective("seqpar %s: --%s expects an integer, got '%s'", cmd, flag, value);
    if (v < min || v > max)
        die_collective("seqpar %s: --%s must be between %ld and %ld, got %ld", cmd, flag, min, max, v);
    return v;
}

const char *take_flag(int *argc, char **argv, const char *cmd, const char *name) {
    size_t len = strlen(name);
    const char *last = NULL; /* every occurrence taken, the last one wins (as getopt's flags) */
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = NULL;
        int used = 0;
        if (!strcmp(a, name)) {
            if (i + 1 >= *argc) die_collective("seqpar %s: %s needs a value", cmd, name);
            v = argv[i + 1];
            used = 2;
        } else if (!strncmp(a, name, len) && a[len] == '=') {
            v = a + len + 1;
            used = 1;
        }
        if (!v) continue;
        for (int j = i; j + used < *argc; j++) argv[j] = argv[j + used];
        *argc -= used;
        last = v;
        i--; /* argv[i] is the next argument now */
    }
    return last;
}

double parse_double(const char *cmd, const char *flag, const char *value, double min, double max) {
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || !end || *end || end == value || !is_decimal_number(value, 1))
        die_collective("seqpar %s: --%s expects a number, got '%s'", cmd, flag, value);
    if (!(v >= min && v <= max))
        die_collective("seqpar %s: --%s must be between %g and %g, got %g", cmd, flag, min, max, v);
    return v;
}

int getopt_full(int argc, char **argv, const char *shortopts, const struct option *opts, const char *cmd) {
    for (const struct option *o = opts; o->name; o++) /* a table with the parallel flags: the knobs too */
        if (o->val == 2012) {
            opts = options_with_knobs(opts);
            break;
        }
    int idx = -1;
    const int opt = getopt_long(argc, argv, shortopts, opts, &idx);
    if (opt == -1 || opt == '?' || opt == ':' || idx < 0 || optind < 1) return opt;
    /* the element that named it: before a separate value, else the last one read */
    const char *text = optarg && optind >= 2 && optarg == argv[optind - 1] ? argv[optind - 2] : argv[optind - 1];
    const char *name = text[0] == '-' && text[1] == '-' ? text + 2 : text;
    const size_t n = strcspn(name, "="), full = strlen(opts[idx].name);
    if (n != full || strncmp(name, opts[idx].name, n) != 0)
        die_collective("seqpar %s: unknown option '--%.*s' (--%s is the option that begins so: options are given in "
                       "full; see 'seqpar %s --help')", cmd, (int)n, name, opts[idx].name, cmd);
    return opt;
}

void die_bad_option(const char *cmd, int argc, char **argv, int opt) {
    const char *arg = (optind - 1 >= 0 && optind - 1 < argc) ? argv[optind - 1] : "?";
    if (opt == ':')
        die_collective("seqpar %s: option '%s' needs a value (see 'seqpar %s --help')", cmd, arg, cmd);
    if (opt == '?' && optopt != 0 && arg[0] == '-' && arg[1] == '-' && strchr(arg, '=')) /* a flag given a value */
        die_collective("seqpar %s: option '%.*s' takes no value: give it alone (see 'seqpar %s --help')", cmd,
                       (int)strcspn(arg, "="), arg, cmd);
    die_collective("seqpar %s: unknown option '%s' (see 'seqpar %s --help')", cmd, arg, cmd);
}

void die_extra_args(const char *cmd, int argc, char **argv) {
    if (optind < argc)
        die_collective("seqpar %s: unexpected argument '%s' (see 'seqpar %s --help')", cmd, argv[optind], cmd);
}

void set_threads(int n) {
    if (n <= 0) return;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int current_threads(void) { return omp_get_max_threads(); }

void size_flags_default(SizeFlags *f) {
    memset(f, 0, sizeof *f);
    LlamaConfig *c = &f->cfg;
    c->num_hidden_layers = 2;
    c->hidden_size = 128;
    c->intermediate_size = 512;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->head_dim = 0; /* derived unless --head-dim */
    c->vocab_size = 64;
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-5f;
    c->max_position_embeddings = 1 << 20;
    c->tie_word_embeddings = 0;
}

const char SIZE_FLAGS_HELP[] =
    "  --layers N          transformer layers (default 2)\n"
    "  --hidden N          hidden size (default 128)\n"
    "  --ffn N             MLP intermediate size (default 512)\n"
    "  --heads N           attention heads (default 4)\n"
    "  --kv-heads N        key/value heads, dividing --heads (default 2)\n"
    "  --head-dim N        head dimension (default hidden/heads)\n"
    "  --vocab N           vocabulary size (default 64; 256 for text data)\n"
    "  --rope-theta X      RoPE base (default 10000)\n"
    "  --tie-embeddings    share the embedding with the output head\n";

int size_flags_handle(SizeFlags *f, const char *cmd, int opt, const char *arg) {
    LlamaConfig *c = &f->cfg;
    if (opt >= 1001 && opt <= 1009) f->given |= 1u << (opt - 1001);
    switch (opt) {
    case 1001: c->num_hidden_layers = (int)parse_long(cmd, "layers", arg, 1, 4096); return 1;
    case 1002: c->hidden_size = (int)parse_long(cmd, "hidden", arg, 1, 1 << 20); return 1;
    case 1003: c->intermediate_size = (int)parse_long(cmd, "ffn", arg, 1, 1 << 22); return 1;
    case 1004: c->num_attention_heads = (int)parse_long(cmd, "heads", arg, 1, 1 << 14); return 1;
    case 1005: c->num_key_value_heads = (int)parse_long(cmd, "kv-heads", arg, 1, 1 << 14); return 1;
    case 1006: c->head_dim = (int)parse_long(cmd, "head-dim", arg, 2, 1 << 14); return 1;
    case 1007: c->vocab_size = (int)parse_long(cmd, "vocab", arg, 2, INT_MAX / 2); return 1;
    case 1008: c->rope_theta = parse_double(cmd, "rope-theta", arg, 1.0, 1e12); return 1;
    case 1009: c->tie_word_embeddings = 1; return 1;
    default: return 0;
    }
}

void size_flags_check(const SizeFlags *f, const LlamaConfig *c, const char *cmd, const char *source) {
    const LlamaConfig *g = &f->cfg;
    const struct { const char *flag, *key; double given, has; } v[] = {
        {"layers", "num_hidden_layers", g->num_hidden_layers, c->num_hidden_layers},
        {"hidden", "hidden_size", g->hidden_size, c->hidden_size},
        {"ffn", "intermediate_size", g->intermediate_size, c->intermediate_size},
        {"heads", "num_attention_heads", g->num_attention_heads, c->num_attention_heads},
        {"kv-heads", "num_key_value_heads", g->num_key_value_heads, c->num_key_value_heads},
        {"head-dim", "head_dim", g->head_dim, c->head_dim},
        {"vocab", "vocab_size", g->vocab_size, c->vocab_size},
        {"rope-theta", "rope_theta", g->rope_theta, c->rope_theta},
        {"tie-embeddings", "tie_word_embeddings", g->tie_word_embeddings, c->tie_word_embeddings},
    };
    for (int i = 0; i < 9; i++)
        if ((f->given >> i & 1u) && v[i].given != v[i].has)
            die_collective("seqpar %s: --%s %g differs from %s's %s %g: the model's own config sets its sizes (drop "
                           "--%s)", cmd, v[i].flag, v[i].given, source, v[i].key, v[i].has, v[i].flag);
}

void parallel_flags_help(FILE *out) {
    char names[256], knobs[2048];
    int len = 0;
    for (int i = 0; strategy_at(i) && len < (int)sizeof names - 40; i++)
        len += snprintf(names + len, sizeof names - (size_t)len, "%s%s%s", i ? ", " : "", strategy_at(i)->name,
                        i ? "" : " (default)");
    strategy_flags_help(knobs, sizeof knobs);
    fprintf(out,
            "parallelism (run under mpirun; world = dp x hp x cp ranks):\n"
            "  --strategy NAME     distributed attention: %s\n"
            "                      ('seqpar strategies' says what each reads)\n"
            "  --dp N              data-parallel replicas (default: ranks / (hp x cp))\n"
            "  --hp N              head parallelism: all-to-all inside a head group (default 1; a heads-only\n"
            "                      strategy: all)\n"
            "  --cp N              context parallelism inside a context group (default 1; a context\n"
            "                      strategy: all)\n"
            "%s"
            "  --offload-dir DIR   a (deleted-on-exit) file per rank in DIR, written and read back by a helper\n"
            "                      thread: a chunked strategy keeps its idle q, k|v, o chunks there;\n"
            "                      --checkpoint layer|selective keeps each layer's input there (any\n"
            "                      strategy); --stats reports the I/O\n"
            "  --placement P       head-first (head groups on consecutive ranks, default) or context-first;\n"
            "                      a strategy with teams: team-first (teams on consecutive ranks) or\n"
            "                      ring-first (sub-rings)\n"
            "  --layout L          zigzag, contiguous or striped token layout (default: the strategy's)\n"
            "  --ranks-per-node N  node size for intra/inter-node accounting (default: from MPI)\n"
            "  --zero N            ZeRO stage (default 0): 0 allreduce gradients; 1 shard the AdamW state;\n"
            "                      2 also reduce-scatter each layer's gradient during backward; 3 also\n"
            "                      shard parameters (each layer gathered before its forward and backward)\n"
            "  --zero-group G      shard inside groups of G consecutive ranks, replicate across groups\n"
            "                      (G divides the ranks; default: all ranks)\n"
            "  --threads N         threads per rank (default: this rank's CPUs / the node's ranks sharing them)\n"
            "  --trace FILE        Chrome trace-event JSON, one track per rank (open in Perfetto)\n"
            "  --stats             print bytes sent per kind, compute and exposed communication per rank\n"
            "                      (train: the whole run's, every step and evaluation)\n"
            "  --comm-timeout S    watchdog: a wait for other ranks longer than S seconds ends the job with\n"
            "                      a message and exit status 3 (default 300; the first step and checkpoint\n"
            "                      saves may take 4 x S; 0 waits forever; else at least 0.1)\n",
            names, knobs);
}

int parallel_flags_handle(ParallelConfig *c, const char *cmd, int opt, const char *arg) {
    switch (opt) {
    case 2001: c->dp = (int)parse_long(cmd, "dp", arg, 1, 1 << 20); return 1;
    case 2002: c->hp = (int)parse_long(cmd, "hp", arg, 1, 1 << 20); return 1;
    case 2003: c->cp = (int)parse_long(cmd, "cp", arg, 1, 1 << 20); return 1;
    case 2005: c->placement = placement_parse(arg); c->placement_given = 1; return 1;
    case 2006: c->layout = layout_parse(arg); c->layout_given = 1; return 1;
    case 2007: c->ranks_per_node = (int)parse_long(cmd, "ranks-per-node", arg, 1, 1 << 20); return 1;
    case 2008: c->zero = (int)parse_long(cmd, "zero", arg, 0, 3); return 1;
    case 2031: c->zero_group = (int)parse_long(cmd, "zero-group", arg, 1, 1 << 20); return 1;
    case 2009: c->trace_path = arg; return 1;
    case 2010: c->stats = 1; return 1;
    case 2011: c->threads = (int)parse_long(cmd, "threads", arg, 1, 4096); return 1;
    case 2012: c->strategy = arg; return 1;
    case 2015:
        if (!*arg) die_collective("--offload-dir needs a directory: name one (an empty path is not the current directory)");
        c->offload_dir = arg;
        return 1;
    case 2030: /* and the deadline of the ranks' error exchanges until the watchdog takes it over */
        c->comm_timeout = parse_double(cmd, "comm-timeout", arg, 0, 1e7);
        if (c->comm_timeout > 0 && c->comm_timeout < 0.1) /* every ordinary wait would end the job */
            die_collective("seqpar %s: --comm-timeout %s is shorter than the ranks' ordinary waits: give 0 (no "
                           "watchdog) or at least 0.1 seconds", cmd, arg);
        exchange_deadline_set(c->comm_timeout * COMM_SLOW_PHASE_FACTOR);
        return 1;
    default: return knob_option_handle(&c->knobs, cmd, opt, arg);
    }
}

const struct option *options_with_knobs(const struct option *opts) {
    static struct {
        const struct option *base;
        struct option *all;
    } made[16];
    static int n_made;
    for (int i = 0; i < n_made; i++)
        if (made[i].base == opts) return made[i].all;
    if (n_made == (int)ARRAY_LEN(made)) die("internal: options_with_knobs called for more than %d tables", n_made);
    size_t n = 0;
    for (; opts[n].name; n++)
        if (opts[n].val >= KNOB_OPTION_FIRST && opts[n].val < KNOB_OPTION_FIRST + KNOB_SLOTS) return opts; /* has them */
    const int knobs = strategy_knob_count();
    struct option *all = xcalloc(n + (size_t)knobs + 1, sizeof *all);
    memcpy(all, opts, n * sizeof *all);
    for (int j = 0; j < knobs; j++)
        all[n + (size_t)j] = (struct option){strategy_knob(j)->name, required_argument, 0, KNOB_OPTION_FIRST + j};
    made[n_made].base = opts;
    made[n_made++].all = all;
    return all;
}

int knob_option_handle(KnobValues *k, const char *cmd, int opt, const char *arg) {
    const StrategyKnob *knob = strategy_knob(opt - KNOB_OPTION_FIRST);
    if (opt < KNOB_OPTION_FIRST || !knob) return 0;
    k->v[opt - KNOB_OPTION_FIRST] = (int)parse_long(cmd, knob->name, arg, 1, knob->max);
    return 1;
}

const char MEMORY_FLAGS_HELP[] =
    "memory:\n"
    "  --checkpoint [MODE]  activation checkpointing: none (default), layer (keep each layer's input,\n"
    "                       recompute the layer, attention's forward included; also --checkpoint alone)\n"
    "                       or selective (also keep attention's output and lse: recompute only the\n"
    "                       projections, never attention's forward)\n"
    "  --ffn-chunks K       run the MLP over K chunks of tokens (default: at least 2 chunks of at most\n"
    "                       " SEQ_STR(LLAMA_FFN_ROWS_MAX) " tokens, and smaller where the MLP's chunk buffers would outgrow the\n"
    "                       attention's gradients, whose memory they share (at least " SEQ_STR(LLAMA_FFN_ROWS_MIN) " tokens); 1: keep\n"
    "                       gate/up whole; streamed layers: 2 x --chunks, inside the attention's chunks,\n"
    "                       and a K given there is rounded up to a multiple of --chunks)\n"
    "  --precision P        fp32 (default) or bf16: mixed precision, bf16 matmul and attention inputs and\n"
    "                       kept attention tensors, fp32 accumulation, weights, optimizer and checkpoints\n"
    "  --no-stream          a strategy that streams its layers under --chunks > 1 runs each layer chunk by\n"
    "                       chunk (projections, exchange, attention, MLP per chunk) under --checkpoint\n"
    "                       none|layer; this runs whole layers instead (the strategy still chunks its\n"
    "                       attention)\n";

int memory_flags_handle(MemoryFlags *f, const char *cmd, int opt, const char *arg, int argc, char **argv) {
    switch (opt) {
    case 3001:
        if (!arg && optind < argc && llama_checkpoint_parse(argv[optind]) >= 0) arg = argv[optind++];
        /* a word after it that is no mode: meant as one (only bench takes words of its own) */
        else if (!arg && optind < argc && argv[optind][0] != '-' && strcmp(cmd, "bench") != 0) arg = argv[optind];
        f->checkpoint = arg ? llama_checkpoint_parse(arg) : LLAMA_CKPT_LAYER;
        if (f->checkpoint < 0)
            die_collective("seqpar %s: --checkpoint expects none, layer or selective (alone: layer), got '%s'", cmd, arg);
        return 1;
    case 3002: f->ffn_chunks = (int)parse_long(cmd, "ffn-chunks", arg, 1, 1 << 30); return 1;
    case 3004: f->no_stream = 1; return 1;
    case 3003:
        f->precision = precision_parse(arg);
        if (f->precision < 0) die_collective("seqpar %s: --precision expects fp32 or bf16, got '%s'", cmd, arg);
        return 1;
    default: return 0;
    }
}

double utilisation_clamp(double u, int *clamped) {
    if (u > 1.0) {
        if (clamped) *clamped = 1;
        return 1.0;
    }
    return u;
}

void offload_flags_check(const ParallelConfig *pc, const MemoryFlags *mf) {
    const Strategy *named = strategy_named(pc->strategy), *s = named ? named : strategy_default();
    const int own_chunks = named && named->reads & KNOB_CHUNK_OFFLOAD; /* unknown names are refused later */
    if (pc->offload_dir && !own_chunks && mf->checkpoint == LLAMA_CKPT_NONE)
        die_collective("%s", strategy_knob_refusal(KNOB_CHUNK_OFFLOAD, s, pc));
    if (mf->no_stream && !(named && named->reads & KNOB_NO_STREAM)) /* like --chunks and --team: a flag no part
                                                                        of this run reads is refused */
        die_collective("%s", strategy_knob_refusal(KNOB_NO_STREAM, s, pc));
}

void offload_errors_check(const LlamaActs *acts, SeqParallel *par) {
    if (!llama_acts_offloads_inputs(acts)) return;
    SeqErr e;
    int failed = llama_acts_io_error(acts, &e) != 0, any = failed;
    if (par->topo.world_size > 1) /* under the watchdog, like every step's control traffic */
        comm_control_allreduce(par->comm, "MPI_Iallreduce (offload errors)", &any, 1, MPI_INT, MPI_MAX, par->topo.world);
    if (any) die_if_any_rank(failed ? &e : NULL); /* every rank is here: the failing rank's line */
}

void parallel_free_or_die(SeqParallel *par) {
    SeqErr e;
    die_if_any_rank(seq_parallel_free(par, &e) != 0 ? &e : NULL);
}

void file_target_check(const char *path) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    SeqErr e;
    die_if_any_rank(rank == 0 && atomic_check_target(path, &e) != 0 ? &e : NULL);
}

/* `p` absolute with its longest existing prefix resolved (realpath) and the rest appended; newly
 * allocated. */
static char *canonical_path(const char *p) {
    char cwd[4096] = "", buf[8192];
    if (p[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    snprintf(buf, sizeof buf, "%s%s%s", cwd, p[0] == '/' ? "" : "/", p);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    for (size_t cut = n;;) { /* the longest prefix (ending at a '/') that resolves */
        char saved = buf[cut];
        buf[cut] = 0;
        char *r = realpath(cut ? buf : "/", NULL);
        buf[cut] = saved;
        if (r) {
            const size_t size = strlen(r) + strlen(buf + cut) + 2;
            char *out = xmalloc(size);
            snprintf(out, size, "%s%s", strcmp(r, "/") ? r : "", *(buf + cut) || strcmp(r, "/") ? buf + cut : "/");
            free(r);
            return out;
        }
        while (cut > 0 && buf[--cut] != '/') {}
    }
}

int path_inside_dir(const char *path, const char *dir) {
    char *p = canonical_path(path), *d = canonical_path(dir);
    const size_t n = strlen(d);
    const int inside = !strncmp(p, d, n) && (p[n] == '/' || !strcmp(d, "/"));
    xfree(p);
    xfree(d);
    return inside;
}

int paths_same(const char *a, const char *b) {
    char *p = canonical_path(a), *q = canonical_path(b);
    const int same = !strcmp(p, q);
    xfree(p);
    xfree(q);
    return same;
}

void trace_target_check(const ParallelConfig *pc, const char *save_dir) {
    const char *t = pc->trace_path;
    if (!t) return;
    file_target_check(t);
    if (save_dir && path_inside_dir(t, save_dir))
        die_collective("--trace %s lies in the --save directory %s, which every save replaces whole: write the trace "
                       "elsewhere", t, save_dir);
    struct stat st;
    if (stat(t, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) { /* only a trace is replaced */
        static const char head[] = "{\"displayTimeUnit\"";
        char got[sizeof head] = "";
        FILE *f = fopen(t, "rb");
        const size_t n = f ? fread(got, 1, sizeof head - 1, f) : 0;
        if (f) fclose(f);
        if (n != sizeof head - 1 || memcmp(got, head, sizeof head - 1) != 0)
            die_collective("--trace %s is an existing file that is not a trace seqpar wrote (the trace, written at the "
                           "end, would replace it): give a new path", t);
    }
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int make_parent_dirs(const char *path, SeqErr *e) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return seq_err(e, "'%.60s...' is %zu characters long: use a path under %zu", path, strlen(path), sizeof buf);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return 0;
    *slash = 0;
    /* each directory on the way, so that the one that fails is the one named (a file in the way,
     * no permission), not the last one with 'No such file or directory' */
    for (char *p = buf + 1;; p++) {
        if (*p && *p != '/') continue;
        const char c = *p;
        *p = 0;
        struct stat st;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return seq_err(e, "cannot create directory '%s': %s", buf, strerror(errno));
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
            return seq_err(e, "cannot create directory '%s': a file of that name is in the way", buf);
        if (!c) return 0;
        *p = c;
    }
}

void pack_flags_default(PackFlags *f) {
    f->pack = 0;
    f->eot = -1;
}

int pack_flags_handle(PackFlags *f, const char *cmd, int opt, const char *arg) {
    switch (opt) {
    case 3201: f->pack = 1; return 1;
    case 3202: f->eot = parse_long(cmd, "eot", arg, 0, INT_MAX - 1); return 1;
    default: return 0;
    }
}

const char PACK_FLAGS_HELP[] =
    "\nPacked documents (token files):\n"
    "  --pack               the sequence holds several documents split at the end-of-text token:\n"
    "                       each token attends only to its own document, positions restart at 0\n"
    "                       per document, the EOT token ends its document (its target, the next\n"
    "                       document's first token, is not trained)\n"
    "  --eot ID             end-of-text token id (default: eos_token_id of the model's config.json)\n";

int pack_flags_eot(const PackFlags *f, const char *cmd, const char *model_dir, int vocab_size) {
    if (!f->pack) {
        if (f->eot >= 0) die_collective("seqpar %s: --eot is read with --pack only: add --pack or drop --eot", cmd);
        return -1;
    }
    long eot = f->eot;
    if (eot < 0 && model_dir) {
        char path[4096];
        SeqErr e;
        int id = -1;
        snprintf(path, sizeof path, "%s/config.json", model_dir);
        int rc = config_json_eos_token_id(path, &id, &e);
        die_if_any_rank(rc < 0 ? &e : NULL);
        if (rc == 0) eot = id;
    }
    if (eot < 0)
        die_collective("seqpar %s: --pack needs the end-of-text token id: pass --eot ID (%s)", cmd,
                       model_dir ? "the model's config.json has no eos_token_id" : "a model from size flags has none");
    if (eot >= vocab_size)
        die_collective("seqpar %s: end-of-text id %ld is outside the vocabulary (vocab_size %d): pass --eot with an id "
                       "below %d", cmd, eot, vocab_size, vocab_size);
    return (int)eot;
}

void size_flags_fit_data(SizeFlags *sf, TokenStream *ts, const char *data) {
    SeqErr err;
    uint32_t max_token = 0;
    die_if_any_rank(token_stream_max_token(ts, &max_token, &err) != 0 ? &err : NULL);
    if ((uint32_t)sf->cfg.vocab_size > max_token) return; /* unsigned: no wrap */
    const int text = ts->data.format == TOKENS_TEXT, need = text ? 256 : (int)max_token + 1; /* max_token < 2^31 - 1 */
    if (sf->given & (1u << (1007 - 1001))) { /* --vocab given: say so rather than change it */
        if (text)
            die_collective("--vocab %d does not cover '%s', text read one token per byte: give --vocab 256 or more, or "
                           "drop --vocab", sf->cfg.vocab_size, data);
        die_collective("--vocab %d does not cover '%s', whose tokens go up to %u: give --vocab %d or more, or drop "
                       "--vocab (the data's size is then taken)", sf->cfg.vocab_size, data, (unsigned)max_token, need);
    }
    sf->cfg.vocab_size = need;
}

void data_length_check(const TokenStream *ts, int seq_len, const char *data) {
    if (ts->total < (size_t)seq_len + 1)
        die_collective("--seq-len %d needs %d tokens but '%s' holds %zu: use a shorter --seq-len", seq_len, seq_len + 1,
                       data, ts->total);
}

int model_dir_check(const char *dir, SeqErr *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!*dir) /* "/config.json" was read */
        return seq_err(e, "--model needs a directory: name one (an empty path is not the current directory)");
    if (!file_exists(dir))
        return seq_err(e, "model directory '%s' does not exist: pass a directory holding config.json", dir);
    if (!file_exists(path)) return seq_err(e, "'%s' is missing: a model directory needs a Hugging Face config.json", path);
    return 0;
}

void model_from_dir(LlamaModel *m, const char *dir, uint64_t seed, int random_init) {
    model_dir_build(m, dir);
    model_dir_load(m, dir, seed, random_init, 0, m->table.total);
}

void model_dir_config(const char *dir, LlamaConfig *cfg) {
    char path[4096];
    SeqErr e;
    const SeqErr *failed = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (model_dir_check(dir, &e) != 0 || checkpoint_verify_model(dir, &e) != 0 || config_json_read(path, cfg, &e) != 0)
        failed = &e; /* a seqpar checkpoint's files against their recorded checksums first */
    die_if_any_rank(failed); /* every rank ends with the same one line */
}
void model_dir_build(LlamaModel *m, const char *dir) {
    LlamaConfig cfg;
    model_dir_config(dir, &cfg);
    llama_build(m, &cfg);
}
/* A directory without weights, as model_dir_load and model_dir_weights_check refuse it. */
static int no_weights_error(const char *dir, SeqErr *e) {
    return seq_err(e, "'%s' holds config.json but no weights (model.safetensors or " ST_INDEX_NAME "): pass "
                   "--random-init (seqpar train, grad) to start from random weights on purpose", dir);
}
void model_dir_weights_check(const char *dir, int random_init) {
    SeqErr e;
    int rc = 0;
    if (!random_init) {
        char single[4096], index[4096];
        struct stat sb;
        snprintf(single, sizeof single, "%s/model.safetensors", dir);
        snprintf(index, sizeof index, "%s/" ST_INDEX_NAME, dir);
        const int has_single = stat(single, &sb) == 0, has_index = stat(index, &sb) == 0;
        /* both or neither: params_read_dir's refusals, which read no weights and no table */
        if (has_single == has_index) rc = params_read_dir(dir, NULL, NULL, 0, 0, 0, &e);
        if (rc == 1) rc = no_weights_error(dir, &e);
    }
    die_if_any_rank(rc != 0 ? &e : NULL);
}

void model_dir_load(LlamaModel *m, const char *dir, uint64_t seed, int random_init, size_t lo, size_t hi) {
    SeqErr e;
    const SeqErr *failed = NULL;
    if (random_init) { /* what was asked, whatever else the directory holds: its weights are not read */
        llama_init_random_part(m, seed, lo, hi);
        return;
    }
    int rc = params_read_dir(dir, &m->table, m->params, m->cfg.tie_word_embeddings, lo, hi, &e);
    if (rc == 1) rc = no_weights_error(dir, &e);
    if (rc != 0) failed = &e;
    die_if_any_rank(failed);
}

void size_flags_validate(LlamaConfig *c) {
    if (c->head_dim == 0 && c->num_attention_heads > 0) { /* no --head-dim: derived */
        if (c->hidden_size % c->num_attention_heads != 0)
            die_collective("--heads %d does not divide --hidden %d: pick heads dividing the hidden size or set "
                           "--head-dim (an even value, e.g. %d)", c->num_attention_heads, c->hidden_size,
                           llama_even_head_dim(c->hidden_size / c->num_attention_heads));
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    llama_config_validate(c, "size flags"); /* a --head-dim given is explicit, whatever its value */
}

void model_from_size(LlamaModel *m, const LlamaConfig *cfg, uint64_t seed) {
    model_size_build(m, cfg);
    llama_init_random(m, seed);
}

void model_size_build(LlamaModel *m, const LlamaConfig *cfg) {
    LlamaConfig c = *cfg;
    size_flags_validate(&c);
    llama_build(m, &c);
}

void print_kernels_header(void) {
    char buf[400];
    isa_describe(buf, sizeof buf);
    printf("kernels: %s\n", buf);
    simd_attn_tiles_describe(buf, sizeof buf);
    printf("attention tiles (fp32 kernel): %s\n", buf);
    blas_describe(buf, sizeof buf);
    printf("BLAS: %s; linear layers: %s sgemm%s\n", buf, sgemm_lib_name(sgemm_lib()),
           getenv("SEQPAR_SGEMM") ? " (SEQPAR_SGEMM)" : "");
    blas_core_warning(buf, sizeof buf);
    if (buf[0]) printf("%s\n", buf);
}
