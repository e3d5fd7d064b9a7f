/* seqpar train: parses train's flags (train/train_options.h) and runs the training library
 * (train/trainer.h), which says what a run does; --strategy auto first puts the planner's pick
 * in its place (train/auto_strategy.h). */
#include <stdlib.h>

#include "cli/commands.h"
#include "train/auto_strategy.h"
#include "train/plan_setup.h"
#include "train/trainer.h"

int cmd_train(int argc, char **argv, const char *program) {
    char **picked = NULL;
    if (strategy_auto_given(argc, argv)) argv = picked = strategy_auto_resolve(argc, argv, program, &argc);
    TrainOptions o;
    SizeFlags sf;
    parse_train_options(argc, argv, &o, &sf, "train");
    const int status = train_run(&o, &sf, argc, argv);
    plan_argv_free(picked);
    return status;
}
