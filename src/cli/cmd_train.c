/* seqpar train: parses train's flags (train/train_options.h) and runs the training library
 * (train/trainer.h), which says what a run does. */
#include <stdlib.h>

#include "cli/commands.h"
#include "train/trainer.h"

int cmd_train(int argc, char **argv) {
    TrainOptions o;
    SizeFlags sf;
    parse_train_options(argc, argv, &o, &sf, "train");
    return train_run(&o, &sf, argc, argv);
}
