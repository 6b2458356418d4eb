// cli: the `weft` command's subcommands.
#pragma once
int weft_cmd_grad(int argc, char **argv);
int weft_cmd_train(int argc, char **argv);
int weft_cmd_tokenize(int argc, char **argv);
int weft_cmd_plot(int argc, char **argv);
