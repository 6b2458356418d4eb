#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE =
    "usage: weft <command> [options]\n"
    "\n"
    "commands (those that run a job also take --config FILE.yaml, --stats FILE.json and\n"
    "key=value settings):\n"
    "  train  [--config FILE.yaml] [key=value ...]\n"
    "         train a model; with no arguments, the built-in default job\n"
    "  grad   --model DIR --batch FILE.jsonl --out FILE.safetensors [--logits] [--logprobs]\n"
    "         [--entropy] [--score] [--busy] [key=value ...]\n"
    "         loss and gradients of a global batch (--score: the forward only); with\n"
    "         train.steps=K also K AdamW steps\n"
    "  plan   [--ranks N] [--batch FILE.jsonl | --lengths FILE] [key=value ...]\n"
    "         the micro-batch plan of a global batch on N ranks, or a simulation of\n"
    "         heterogeneous DCP, uniform DCP and static CP on a trace of lengths\n"
    "  rl     [--config FILE.yaml] [key=value ...]\n"
    "         RL post-training (GRPO, RLOO, PPO-clip, GSPO, CISPO, GMPO) with rollouts from the\n"
    "         trainer's own weights; with no arguments, GRPO on the built-in task after the\n"
    "         default job\n"
    "  generate --model DIR --prompts FILE.jsonl --out FILE.jsonl [key=value ...]\n"
    "         completions of every prompt with the model (sampling.*, rollout.* settings)\n"
    "  calibrate [--out FILE.yaml] [--repeats N] [key=value ...]\n"
    "         time the model on these ranks (run it under mpirun) and fit the planner's cost\n"
    "  tokenize [--tokenizer FILE.json] [--decode]\n"
    "         encode stdin to token ids (or decode ids back to text)\n"
    "  plot   METRICS.jsonl -o FILE.png|FILE.svg [--log]\n"
    "         draw a run's curves (loss and accuracy; an RL run's reward, length, entropy, phases)\n";

typedef int (*job_verb)(int argc, char **argv, weft_session *session);

int main(int argc, char **argv) {
    weft_session_prepare_process(); // may re-execute the process: first, before any thread exists
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    job_verb job = !strcmp(argv[1], "train")       ? weft_cmd_train
                   : !strcmp(argv[1], "grad")      ? weft_cmd_grad
                   : !strcmp(argv[1], "calibrate") ? weft_cmd_calibrate
                   : !strcmp(argv[1], "generate")  ? weft_cmd_generate
                   : !strcmp(argv[1], "rl")        ? weft_cmd_rl
                                                   : NULL;
    if (job) {
        // Under mpirun every rank runs the same command; launched alone, a one-rank world.
        weft_session *session = weft_session_begin(&argc, &argv);
        int rc = job(argc - 2, argv + 2, session);
        weft_session_end(session);
        return rc;
    }
    if (!strcmp(argv[1], "tokenize")) return weft_cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "plot")) return weft_cmd_plot(argc - 2, argv + 2);
    if (!strcmp(argv[1], "plan")) return weft_cmd_plan(argc - 2, argv + 2);
    fprintf(stderr, "weft: error: unknown command \"%s\"\n%s", argv[1], USAGE);
    return 2;
}
