// cli: the `weft` command's subcommands.
#pragma once
#include "comm/comm.h"
int weft_cmd_grad(int argc, char **argv, weft_comm *world);
int weft_cmd_train(int argc, char **argv, weft_comm *world);
int weft_cmd_tokenize(int argc, char **argv);
int weft_cmd_plot(int argc, char **argv);
int weft_cmd_plan(int argc, char **argv);
int weft_cmd_calibrate(int argc, char **argv, weft_comm *world);
