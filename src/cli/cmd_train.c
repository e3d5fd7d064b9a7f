/* seqpar train: parses train's flags (train/train_options.h) and runs the training library
 * (train/trainer.h), which says what a run does; --strategy auto first puts the planner's pick
 * in its place (train/auto_strategy.h). */
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/common.h"
#include "train/auto_strategy.h"
#include "train/plan_setup.h"
#include "train/trainer.h"

int cmd_train(int argc, char **argv, const char *program) {
    char **picked = NULL;
    if (strategy_auto_given(argc, argv)) argv = picked = strategy_auto_resolve(argc, argv, program, &argc);
    else
        for (int i = 1; i < argc; i++) /* read by --strategy auto alone */
            if (!strncmp(argv[i], "--profile", 9) && (!argv[i][9] || argv[i][9] == '=' || !strncmp(argv[i] + 9, "-top", 4)))
                die_collective("seqpar train: %s times the planner's candidates for --strategy auto: add --strategy auto "
                               "or drop it", argv[i]);
    TrainOptions o;
    SizeFlags sf;
    parse_train_options(argc, argv, &o, &sf, "train");
    const int status = train_run(&o, &sf, argc, argv);
    plan_argv_free(picked);
    return status;
}
