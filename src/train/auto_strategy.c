/* seqpar train --strategy auto: the planner's pick for the running job, as train flags
 * (auto_strategy.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>
#include <omp.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "io/read_file.h"
#include "plan/cluster.h"
#include "plan/planner.h"
#include "train/auto_strategy.h"
#include "train/cli_common.h"
#include "train/plan_setup.h"
#include "train/seq_parallel.h"
#include "train/train_options.h"
#include "train/trainer.h"

#define WHO "seqpar train --strategy auto"

int strategy_auto_words(int argc, char **argv, int i) {
    if (!strcmp(argv[i], "--strategy=auto")) return 1;
    return !strcmp(argv[i], "--strategy") && i + 1 < argc && !strcmp(argv[i + 1], "auto") ? 2 : 0;
}

int strategy_auto_given(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strategy_auto_words(argc, argv, i)) return 1;
    return 0;
}

/* The configuration a checkpoint recorded (TRAIN_RECORD_KEY), "" where it has none: rank 0 reads
 * its trainer state, every rank gets the text (xmalloc'd). A state that does not read is left to
 * the run's own refusal of the checkpoint. */
static char *recorded_config(const char *dir) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char found[sizeof ((CkptSetting *)0)->value] = "";
    if (rank == 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/trainer_state.json", dir);
        unsigned char *text = NULL;
        size_t len = 0;
        SeqErr e;
        TrainerState *st = xmalloc(sizeof *st);
        if (read_regular_file(path, "trainer state", 1 << 20, &text, &len, &e) == 0 &&
            trainer_state_parse((const char *)text, len, path, st, &e) == 0) {
            const char *v = trainer_state_get(st, TRAIN_RECORD_KEY);
            if (v) snprintf(found, sizeof found, "%s", v);
        }
        xfree(text);
        xfree(st);
    }
    return plan_bcast_text(found);
}

/* The planner's search for this job from train's flags (argv without --strategy auto, read as o):
 * its ranks (--dry-run --ranks P: P), ranks per node (MPI's shared-memory split, or
 * --ranks-per-node), threads (--threads or train's default) and RAM per rank (--mem-per-rank, read
 * by plan), on cluster this-machine where calibrated (*calibrated). Collective; where nothing runs or
 * fits every rank ends with one line naming `who`. exact: the list's first entries read (plan_setup's).
 * Free with plan_setup_free and xfree. */
static PlanSetup *auto_plan(int nrest, char **rest, const TrainOptions *o, const char *who, int exact, int *calibrated) {
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int ranks = o->dry_run && o->dry_ranks ? o->dry_ranks : world;
    const int rpn_mpi = seq_parallel_ranks_on_node(); /* collective: every rank calls it */
    const int rpn = o->par.ranks_per_node > 0 ? o->par.ranks_per_node : o->dry_run && o->dry_ranks ? ranks : rpn_mpi;
    const int thr_default = seq_parallel_default_threads(); /* collective */
    /* a --dry-run --ranks P job: the cores over its ranks per node, as the dry run counts them */
    const int thr_dry = omp_get_num_procs() / rpn > 1 ? omp_get_num_procs() / rpn : 1;
    const int thr = o->par.threads > 0 ? o->par.threads : o->dry_run && o->dry_ranks ? thr_dry : thr_default;
    char path[4096];
    *calibrated = rank == 0 && access(cluster_this_machine_path(path, sizeof path), R_OK) == 0;
    MPI_Bcast(calibrated, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char w_ranks[16], w_rpn[16], w_cores[16];
    snprintf(w_ranks, sizeof w_ranks, "%d", ranks);
    snprintf(w_rpn, sizeof w_rpn, "%d", rpn);
    snprintf(w_cores, sizeof w_cores, "%d", thr * rpn);
    char **pargv = xmalloc(sizeof(char *) * ((size_t)nrest + 10));
    int pargc = 0;
    pargv[pargc++] = rest[0];
    if (*calibrated) pargv[pargc++] = "--cluster", pargv[pargc++] = "this-machine";
    pargv[pargc++] = "--ranks", pargv[pargc++] = w_ranks;
    pargv[pargc++] = "--cores-per-node", pargv[pargc++] = w_cores;
    if (o->par.ranks_per_node <= 0) pargv[pargc++] = "--ranks-per-node", pargv[pargc++] = w_rpn;
    for (int i = 1; i < nrest; i++) { /* --threads: the plan's --cores-per-node above; --dry-run: train's */
        if (!strcmp(rest[i], "--threads") && i + 1 < nrest) i++;
        else if (strncmp(rest[i], "--threads=", 10) != 0 && strcmp(rest[i], "--dry-run") != 0) pargv[pargc++] = rest[i];
    }
    pargv[pargc] = NULL;
    PlanSetup *ps = xmalloc(sizeof *ps);
    plan_setup(&pargc, pargv, who, exact, ps);
    xfree(pargv);
    if (ps->n == 0)
        die_collective("%s: nothing runs on %d rank%s with the flags given: %s", who, ranks, ranks == 1 ? "" : "s",
                       plan_setup_refusal(ps));
    const PlanEntry *best = &ps->list[0];
    if (!best->fits)
        die_collective("%s: no configuration fits in %.1f MiB per rank: the smallest needs %.1f MiB: give "
                       "--mem-per-rank with more, more ranks, or a shorter --seq-len", who,
                       ps->cl.ram_bytes / 1048576.0, best->ram / 1048576.0);
    return ps;
}

/* argv without its --strategy auto words (the array of argv's pointers, xmalloc'd), *n words. */
static char **without_auto(int argc, char **argv, int *n) {
    char **rest = xmalloc(sizeof(char *) * ((size_t)argc + 1));
    *n = 0;
    for (int i = 0; i < argc; i++) {
        const int k = i ? strategy_auto_words(argc, argv, i) : 0;
        if (k) i += k - 1;
        else rest[(*n)++] = argv[i];
    }
    rest[*n] = NULL;
    return rest;
}

/* train's options of argv (getopt permutes its array: read from a copy) */
static void read_options(int argc, char **argv, const char *cmd, TrainOptions *o, SizeFlags *sf) {
    char **scan = xmalloc(sizeof(char *) * ((size_t)argc + 1));
    memcpy(scan, argv, sizeof(char *) * ((size_t)argc + 1));
    parse_train_options(argc, scan, o, sf, cmd);
    xfree(scan);
}

char *strategy_auto_pick(int argc, char **argv, const char *who, char *desc, size_t dn) {
    int rank = 0, calibrated;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    TrainOptions o;
    SizeFlags sf;
    read_options(argc, argv, "plan", &o, &sf);
    PlanSetup *ps = auto_plan(argc, argv, &o, who, 1, &calibrated);
    char pick[512] = "";
    if (rank == 0) {
        plan_flags(&ps->list[0], pick, sizeof pick);
        snprintf(desc, dn, "the planner's pick of %d configurations (predicted %.3g s a training step on %s)", ps->fit,
                 ps->list[0].t_step, calibrated ? "cluster this-machine" : "the rates measured here");
    }
    plan_setup_free(ps);
    xfree(ps);
    return plan_bcast_text(pick);
}

char **strategy_auto_resolve(int argc, char **argv, const char *program, int *out_argc) {
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    /* train's flags without --strategy auto: what plan reads (with no --strategy: every strategy) */
    int nrest;
    char **rest = without_auto(argc, argv, &nrest);
    /* --profile K [--profile-top N]: the planner's N best timed K steps each here, the fastest run */
    long profile_steps = 0;
    int profile_top = 3;
    const char *v;
    if ((v = take_flag(&nrest, rest, "train", "--profile"))) profile_steps = parse_long("train", "profile", v, 1, 1000000);
    if ((v = take_flag(&nrest, rest, "train", "--profile-top"))) profile_top = (int)parse_long("train", "profile-top", v, 1, 64);
    if (v && !profile_steps)
        die_collective("%s: --profile-top %d names how many configurations --profile K times: give --profile K too",
                       WHO, profile_top);
    TrainOptions o;
    SizeFlags sf;
    read_options(nrest, rest, "train", &o, &sf);
    char flags[8192], launch[4300], prog[4096];
    if (program_word(program, prog, sizeof prog) != 0)
        die_collective("%s: the program's path is over %zu characters: run it by a shorter one", WHO, sizeof prog);
    /* a resume takes the configuration its checkpoint recorded (the run continues as it was trained:
     * a fresh pick could differ with the measured rates, or with another world) */
    const char *resume = o.resume_dir;
    if (!resume && o.auto_resume && o.save_dir) {
        int holds = rank == 0 && checkpoint_exists(o.save_dir);
        MPI_Bcast(&holds, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (holds) resume = o.save_dir;
    }
    char *recorded = resume ? recorded_config(resume) : NULL;
    char *line;
    if (recorded && *recorded) {
        if (plan_user_flags(nrest, rest, 1, flags, sizeof flags) != 0)
            die_collective("%s: the train flags given are over %zu characters: shorten the paths", WHO, sizeof flags);
        const size_t k = strlen(flags);
        snprintf(flags + k, sizeof flags - k, "%s%s", k ? " " : "", recorded);
        if (rank == 0) {
            printf("strategy auto: resuming %s with the configuration it recorded: mpirun -n %d %s train %s\n", resume,
                   world, prog, flags);
            fflush(stdout);
        }
        line = plan_bcast_text(flags);
    } else {
        int calibrated;
        PlanSetup *ps = auto_plan(nrest, rest, &o, WHO, profile_steps ? profile_top : 1, &calibrated);
        if (profile_steps && o.dry_run)
            die_collective("%s: --profile runs training steps, which --dry-run does not: drop one of them", WHO);
        const int row = profile_steps ? plan_setup_profile(ps, profile_steps, profile_top, nrest, rest, program, NULL) : 0;
        const PlanEntry *best = &ps->list[row];
        if (rank == 0) {
            char how[128] = "";
            if (profile_steps)
                snprintf(how, sizeof how, ", the fastest of its %d best measured (row %d)",
                         profile_top < ps->fit ? profile_top : ps->fit, row + 1);
            if (plan_setup_command(ps, best, nrest, rest, program, launch, sizeof launch, flags, sizeof flags) != 0)
                snprintf(flags, sizeof flags, "%s", ""); /* said below, on every rank */
            else
                printf("strategy auto: the planner's pick of %d configurations%s (predicted %.3g s a step on %s): %s %s\n",
                       ps->fit, how, best->t_step, calibrated ? "cluster this-machine" : "the rates measured here",
                       launch, flags);
            fflush(stdout);
        }
        line = plan_bcast_text(flags);
        if (!*line)
            die_collective("%s: the train flags given are over %zu characters: shorten the paths", WHO, sizeof flags);
        plan_setup_free(ps);
        xfree(ps);
    }
    xfree(recorded);
    char **out = plan_flags_argv(argv[0], line, out_argc);
    if (!out) die_collective("%s: the pick's flags do not split into words: %s", WHO, line);
    xfree(line);
    xfree(rest);
    return out;
}
