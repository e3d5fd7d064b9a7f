/* The seqpar subcommands; each parses its own GNU long options and returns an exit status. */
#ifndef SEQPAR_COMMANDS_H
#define SEQPAR_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_strategies(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_memory(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#endif
