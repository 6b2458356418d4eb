// cli: the `weft` command's subcommands.
#pragma once
int weft_cmd_grad(int argc, char **argv);
