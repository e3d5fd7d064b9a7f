/* The seqpar subcommands; each parses its own GNU long options and returns an exit status. */
#ifndef SEQPAR_COMMANDS_H
#define SEQPAR_COMMANDS_H

int cmd_train(int argc, char **argv, const char *program);
int cmd_grad(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_strategies(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_eval(int argc, char **argv, const char *program);
int cmd_memory(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
/* program: the program as it was invoked (main's argv[0]), for the best line's command */
int cmd_plan(int argc, char **argv, const char *program);

#endif
