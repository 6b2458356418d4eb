// rollout: `weft generate`, completions for a file of prompts with a Hugging Face model directory.
// Input rows {"prompt": "..."} (tokenized with the directory's tokenizer.json) or {"input_ids":
// [...]}; each output row keeps the input's fields and adds "responses": sampling.n objects
// {"text", "token_ids", "logprobs", "finish_reason"} ("text" only with a tokenizer;
// "processed_logprobs" when sampling.processed_logprobs). Under mpirun the prompts are spread over
// the ranks by estimated cost and one rank writes the output in input order, atomically.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "rollout/config.h"

typedef struct weft_generate_request {
    const char *model_dir, *prompts, *out;
    const char *stats;            // JSON statistics (NULL: none)
    const char *drop_tensors;     // model.drop_tensors (weft_model_options)
    weft_device device;
    double device_timeout; // seconds a host wait for the GPU may take (0: no limit)
    double collective_timeout;
    bool debug_collectives;
    weft_sampling_config sampling;
    weft_rollout_config rollout;
} weft_generate_request;

int weft_generate_run(const weft_generate_request *r, weft_comm *world);
