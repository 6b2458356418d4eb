#include "train/config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <yaml.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <unistd.h>

// KEY_STRINGS and KEY_INTS are lists (a JSON array on the command line, a YAML sequence, or one
// bare value): an array field at the key's offset with its count elsewhere (list_def).
typedef enum { KEY_INT, KEY_REAL, KEY_BOOL, KEY_STRING, KEY_CHOICE, KEY_STRINGS, KEY_INTS } key_type;

typedef struct list_def {
    size_t count_offset; // of the int holding how many entries are set
    int capacity;        // entries
    int entry_len;       // KEY_STRINGS: bytes per string entry
} list_def;

typedef struct key_def {
    const char *key;
    key_type type;
    size_t offset;
    const char *help;
    // KEY_CHOICE: the names of the int's values 0, 1, ..., then NULL (const char *const *);
    // lists: their list_def.
    const void *extra;
} key_def;

static const char *const DCP_MODES[] = {"uniform", "heterogeneous", NULL}; // weft_dcp_mode
static const char *const DEVICES[] = {"cpu", "cuda", NULL};                   // weft_device
static const char *const POLICY_LOSSES[] = {"ppo", "gspo", "cispo", "geo_mean", NULL};             // weft_policy_loss
static const char *const KL_TYPES[] = {"k1", "k2", "k3", NULL};               // weft_kl_type
static const char *const KL_CTRLS[] = {"fixed", "adaptive", NULL};          // weft_kl_ctrl
static const char *const ADV_ESTIMATORS[] = {"grpo", "rloo", "reinforce_plus_plus_baseline",
                                             "reinforce_plus_plus", NULL}; // weft_adv_estimator
static const char *const REWARD_TYPES[] = {"exact_match", "command", NULL}; // weft_reward_type
static const char *const AGG_MODES[] = {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                        "seq-mean-token-sum-norm", NULL}; // weft_loss_agg_mode

_Static_assert((int)WEFT_REWARD_TEXT_MAX == (int)WEFT_PATH_MAX, "string keys hold WEFT_PATH_MAX bytes");
#define F(f) offsetof(weft_job_config, f)
static const key_def KEYS[] = {
    {"model.path", KEY_STRING, F(model.path), "Hugging Face model directory; empty: from scratch", NULL},
    {"model.drop_tensors", KEY_STRING, F(model.drop_tensors), "checkpoint tensors the model does not use that loading may drop: [name, ...] (an unused tensor is otherwise an error)", NULL},
    {"model.hidden_size", KEY_INT, F(model.arch.hidden_size), "hidden size (from scratch)", NULL},
    {"model.intermediate_size", KEY_INT, F(model.arch.intermediate_size), "MLP size (from scratch)", NULL},
    {"model.num_layers", KEY_INT, F(model.arch.num_layers), "decoder layers (from scratch)", NULL},
    {"model.num_heads", KEY_INT, F(model.arch.num_heads), "attention heads (from scratch)", NULL},
    {"model.num_kv_heads", KEY_INT, F(model.arch.num_kv_heads), "key/value heads (from scratch)", NULL},
    {"model.head_dim", KEY_INT, F(model.arch.head_dim), "attention head size; 0: hidden_size / num_heads (from scratch)", NULL},
    {"model.rope_theta", KEY_REAL, F(model.arch.rope_theta), "RoPE base (from scratch)", NULL},
    {"model.rms_norm_eps", KEY_REAL, F(model.arch.rms_norm_eps), "RMSNorm epsilon (from scratch)", NULL},
    {"model.attention_bias", KEY_BOOL, F(model.arch.attention_bias), "q/k/v projection biases (from scratch)", NULL},
    {"model.tie_word_embeddings", KEY_BOOL, F(model.arch.tie_word_embeddings), "share embedding and head", NULL},
    {"model.mtp_layers", KEY_INT, F(model.arch.num_mtp), "multi-token prediction modules (from scratch)", NULL},
    {"model.mtp_loss_scale", KEY_REAL, F(model.arch.mtp_loss_scale), "MTP loss weight lambda (from scratch)", NULL},
    {"data.source", KEY_STRING, F(data.source), "\"synthetic\" or a JSONL file", NULL},
    {"data.tokenizer", KEY_STRING, F(data.tokenizer), "a tokenizer.json, or bytes (UTF-8 bytes); empty: the model directory's tokenizer.json, bytes for a model from scratch", NULL},
    {"data.synthetic_documents", KEY_INT, F(data.synthetic_documents), "synthetic task size", NULL},
    {"data.truncate", KEY_BOOL, F(data.truncate), "truncate documents over the token budget", NULL},
    {"train.steps", KEY_INT, F(train.steps), "optimizer steps", NULL},
    {"train.global_batch_size", KEY_INT, F(train.global_batch_size), "documents per step", NULL},
    {"train.max_tokens_per_microbatch", KEY_INT, F(train.max_tokens_per_microbatch),
     "token budget of a micro-batch (0: use train.micro_batches)", NULL},
    {"train.micro_batches", KEY_INT, F(train.micro_batches), "micro-batches per global batch", NULL},
    {"train.recompute", KEY_BOOL, F(train.recompute), "recompute block activations in backward", NULL},
    {"train.freeze_mtp", KEY_BOOL, F(train.freeze_mtp), "keep the MTP modules fixed", NULL},
    {"train.seed", KEY_INT, F(train.seed), "seed of initialisation and data order", NULL},
    {"train.output_dir", KEY_STRING, F(train.output_dir), "where checkpoints and metrics go", NULL},
    {"train.save_every", KEY_INT, F(train.save_every), "checkpoint every N steps (0: at the end)", NULL},
    {"train.save_shard_mb", KEY_REAL, F(train.save_shard_mb),
     "checkpoint weights in shards of at most this many MB (10^6 bytes) with an index, as "
     "save_pretrained's max_shard_size; one model.safetensors when they fit", NULL},
    {"train.log_every", KEY_INT, F(train.log_every), "plain log line every N steps", NULL},
    {"parallel.use_distributed_optimizer", KEY_BOOL, F(parallel.use_distributed_optimizer),
     "shard AdamW state over data-parallel ranks (ZeRO-1)", NULL},
    {"parallel.overlap_grad_reduce", KEY_BOOL, F(parallel.overlap_grad_reduce),
     "reduce gradient buckets while backward continues (false: all after it)", NULL},
    {"parallel.context_parallel_size", KEY_INT, F(parallel.context_parallel_size),
     "ranks that split each document (context parallelism); world = dp x this", NULL},
    {"parallel.dynamic_context_parallel", KEY_BOOL, F(parallel.dynamic_context_parallel),
     "pick a context-parallel degree per micro-batch (DCP); world must be a power of two", NULL},
    {"parallel.max_seqlen_per_rank", KEY_INT, F(parallel.max_seqlen_per_rank),
     "DCP: most rows of a micro-batch one rank holds", NULL},
    {"parallel.dcp_mode", KEY_CHOICE, F(parallel.dcp_mode),
     "DCP: uniform (one degree per micro-batch step) or heterogeneous (one per document)",
     DCP_MODES},
    {"parallel.cost_alpha", KEY_REAL, F(parallel.cost_alpha),
     "planner's cost of a document (alpha*L^2 + beta*L)/c + gamma: alpha (weft calibrate)", NULL},
    {"parallel.cost_beta", KEY_REAL, F(parallel.cost_beta), "planner's document cost: beta", NULL},
    {"parallel.cost_gamma", KEY_REAL, F(parallel.cost_gamma),
     "planner's document cost: gamma, fixed per document and rank", NULL},
    {"parallel.cost_delta", KEY_REAL, F(parallel.cost_delta),
     "planner's CP exchange cost: per key/value row a rank receives", NULL},
    {"parallel.cost_epsilon", KEY_REAL, F(parallel.cost_epsilon),
     "planner's cost: fixed per micro-batch and rank", NULL},
    {"parallel.debug_collectives", KEY_BOOL, F(parallel.debug_collectives),
     "cross-check every rank's collective sequence", NULL},
    {"parallel.collective_timeout", KEY_REAL, F(parallel.collective_timeout),
     "seconds a collective may wait before the job aborts", NULL},
    {"parallel.bucket_mb", KEY_INT, F(parallel.bucket_mb),
     "gradient bucket size (MiB), one collective each (DDP and distributed optimizer)", NULL},
    {"sampling.temperature", KEY_REAL, F(sampling.temperature), "softmax temperature; 0: greedy", NULL},
    {"sampling.top_k", KEY_INT, F(sampling.top_k), "keep the k most likely tokens; 0: off", NULL},
    {"sampling.top_p", KEY_REAL, F(sampling.top_p), "nucleus: keep the most likely tokens up to this mass; 1: off", NULL},
    {"sampling.min_p", KEY_REAL, F(sampling.min_p), "keep tokens at least this times the most likely's probability; 0: off", NULL},
    {"sampling.max_tokens", KEY_INT, F(sampling.max_tokens), "new tokens per sample at most", NULL},
    {"sampling.n", KEY_INT, F(sampling.n), "samples per prompt", NULL},
    {"sampling.seed", KEY_INT, F(sampling.seed), "seed of the samples' random streams", NULL},
    {"sampling.stop", KEY_STRINGS, F(sampling.stop), "strings that end a sample (a JSON list)",
     &(const list_def){F(sampling.n_stop), WEFT_MAX_STOP, WEFT_MAX_STOP_LEN}},
    {"sampling.stop_token_ids", KEY_INTS, F(sampling.stop_token_ids),
     "token ids that end a sample (a JSON list; [] none); unset: the model's end-of-text",
     &(const list_def){F(sampling.n_stop_token_ids), WEFT_MAX_STOP, 0}},
    {"sampling.processed_logprobs", KEY_BOOL, F(sampling.processed_logprobs),
     "also record log-probs under the processed distribution", NULL},
    {"rollout.block_size", KEY_INT, F(rollout.block_size), "KV cache positions per block", NULL},
    {"rollout.kv_cache_tokens", KEY_INT, F(rollout.kv_cache_tokens),
     "KV cache size in positions; 0: rollout.kv_cache_fraction of free memory", NULL},
    {"rollout.kv_cache_fraction", KEY_REAL, F(rollout.kv_cache_fraction),
     "KV cache size as a fraction of the device's free memory", NULL},
    {"rollout.max_batch_tokens", KEY_INT, F(rollout.max_batch_tokens),
     "rows one generation forward holds at most (prefills are chunked to it)", NULL},
    {"rollout.max_running", KEY_INT, F(rollout.max_running),
     "sequences generated at once at most; 0: as many as the KV cache holds", NULL},
    {"rollout.speculative_tokens", KEY_INT, F(rollout.speculative_tokens),
     "tokens the model's MTP modules draft per step (speculative decoding); 0: off", NULL},
    {"rollout.draft_bf16", KEY_BOOL, F(rollout.draft_bf16),
     "device=cpu: drafts read the weights rounded to bf16 (half the bytes; outputs and log-probs "
     "unchanged, verification decides); false: the fp32 weights", NULL},
    {"rollout.cuda_graphs", KEY_BOOL, F(rollout.cuda_graphs),
     "device=cuda: replay decode steps as recorded CUDA graphs; false: launch every kernel",
     NULL},
    {"rollout.async_scheduling", KEY_BOOL, F(rollout.async_scheduling),
     "device=cuda: launch each decode step before the host has read the last one's tokens (a "
     "sample that stops computes one row in vain); false: each step waits for the last's tokens",
     NULL},
    {"rollout.batch_invariant", KEY_BOOL, F(rollout.batch_invariant),
     "device=cuda: every row's bits independent of its batching (one product kernel for every "
     "row count, all attention paged at fixed splits): byte-identical output whatever the "
     "batching, pool or ranks, as on the CPU, at some speed; false: the fastest kernels", NULL},
    {"rollout.prefix_caching", KEY_BOOL, F(rollout.prefix_caching),
     "a prompt starting with tokens whose keys and values are in the KV cache (a shared system "
     "prompt, a preempted sample's own) reuses them, computing only the rest (same bits on the "
     "CPU)", NULL},
    {"rl.policy_loss", KEY_CHOICE, F(rl.policy_loss),
     "ppo (token-level ratio), gspo (sequence-level ratio), cispo (the clipped ratio a "
     "constant weight on every token's log-prob) or geo_mean (GMPO: the geometric mean of the "
     "sequence's clipped token ratios)", POLICY_LOSSES},
    {"rl.clip_ratio_low", KEY_REAL, F(rl.clip_ratio_low), "ratio clipped below at 1 - this", NULL},
    {"rl.clip_ratio_high", KEY_REAL, F(rl.clip_ratio_high), "ratio clipped above at 1 + this", NULL},
    {"rl.clip_ratio_c", KEY_REAL, F(rl.clip_ratio_c),
     "dual clip: a negative advantage's loss is at most -A times this (ppo); 0: off", NULL},
    {"rl.kl_loss_coef", KEY_REAL, F(rl.kl_loss_coef),
     "weight of the KL-to-reference loss; 0: no reference model", NULL},
    {"rl.kl_loss_type", KEY_CHOICE, F(rl.kl_loss_type),
     "k1 (logp - ref), k2 (squared / 2) or k3 (low-variance, clamped to [-10, 10])", KL_TYPES},
    {"rl.use_kl_in_reward", KEY_BOOL, F(rl.use_kl_in_reward),
     "subtract rl.kl_coef x the response's KL to the reference from each reward", NULL},
    {"rl.kl_penalty", KEY_CHOICE, F(rl.kl_penalty),
     "KL in the reward, per token: k1, k2 or k3 (as rl.kl_loss_type)", KL_TYPES},
    {"rl.kl_ctrl", KEY_CHOICE, F(rl.kl_ctrl),
     "KL in the reward: a fixed rl.kl_coef, or adaptive toward rl.kl_target", KL_CTRLS},
    {"rl.kl_coef", KEY_REAL, F(rl.kl_coef), "KL in the reward: the coefficient (its start)", NULL},
    {"rl.kl_target", KEY_REAL, F(rl.kl_target),
     "adaptive KL coefficient: the per-token KL it steers toward", NULL},
    {"rl.kl_horizon", KEY_REAL, F(rl.kl_horizon),
     "adaptive KL coefficient: a step of N samples moves it by at most 0.2 N / this", NULL},
    {"rl.tis_imp_ratio_cap", KEY_REAL, F(rl.tis_imp_ratio_cap),
     "truncated importance sampling: policy-gradient terms times min(exp(old - rollout logp), "
     "this); 0: off", NULL},
    {"rl.entropy_coeff", KEY_REAL, F(rl.entropy_coeff), "weight of the entropy bonus", NULL},
    {"rl.loss_agg_mode", KEY_CHOICE, F(rl.loss_agg_mode),
     "how token losses become one number (global denominators)", AGG_MODES},
    {"rl.loss_scale_factor", KEY_REAL, F(rl.loss_scale_factor),
     "seq-mean-token-sum-norm's divisor; 0: sampling.max_tokens", NULL},
    {"rl.adv_estimator", KEY_CHOICE, F(rl.adv_estimator),
     "grpo, rloo, reinforce_plus_plus_baseline (group mean off, whitened over the batch) or "
     "reinforce_plus_plus (per-token returns, whitened)",
     ADV_ESTIMATORS},
    {"rl.norm_adv_by_std", KEY_BOOL, F(rl.norm_adv_by_std),
     "grpo divides by the group's std (false: Dr. GRPO)", NULL},
    {"rl.ppo_epochs", KEY_INT, F(rl.ppo_epochs), "passes over each step's samples", NULL},
    {"rl.ppo_mini_batch_size", KEY_INT, F(rl.ppo_mini_batch_size),
     "prompts per policy update; 0: the step's train.global_batch_size", NULL},
    {"rl.min_terms", KEY_INT, F(rl.min_terms), "built-in task: fewest terms of an RL problem", NULL},
    {"rl.max_terms", KEY_INT, F(rl.max_terms), "built-in task: most terms of an RL problem", NULL},
    {"rl.term_below", KEY_INT, F(rl.term_below),
     "built-in task: every RL term is below this; 0: the SFT task's 1-4 digit mix", NULL},
    {"rl.eval_prompts", KEY_INT, F(rl.eval_prompts), "held-out problems scored greedily", NULL},
    {"rl.eval_every", KEY_INT, F(rl.eval_every), "steps between held-out evaluations; 0: none", NULL},
    {"rl.eval_n", KEY_INT, F(rl.eval_n),
     "responses per held-out problem; above 1 the job reports pass@k too", NULL},
    {"rl.eval_temperature", KEY_REAL, F(rl.eval_temperature),
     "held-out sampling temperature; 0: greedy", NULL},
    {"rl.dynamic_sampling", KEY_BOOL, F(rl.dynamic_sampling),
     "DAPO: drop groups whose rewards are all equal and generate more", NULL},
    {"rl.max_gen_batches", KEY_INT, F(rl.max_gen_batches),
     "dynamic sampling: generation rounds per step at most", NULL},
    {"rl.overlong_buffer", KEY_INT, F(rl.overlong_buffer),
     "DAPO: responses within this many tokens of sampling.max_tokens are penalized; 0: off", NULL},
    {"rl.overlong_penalty", KEY_REAL, F(rl.overlong_penalty),
     "DAPO: the penalty reached at sampling.max_tokens", NULL},
    {"rl.offload_training_state", KEY_BOOL, F(rl.offload_training_state),
     "while rollout runs, optimizer state in host memory, gradients and activations freed",
     NULL},
    {"rl.recompute_old_logprobs", KEY_BOOL, F(rl.recompute_old_logprobs),
     "the trainer scores the samples for old log-probs (the mismatch measured); false: the "
     "rollout's serve", NULL},
    {"rl.rollout_ranks", KEY_INT, F(rl.rollout_ranks),
     "ranks that only generate (the last ones), the others only train; 0: every rank does both",
     NULL},
    {"rl.one_step_off_policy", KEY_BOOL, F(rl.one_step_off_policy),
     "with rl.rollout_ranks: the next step's samples generate while the trainers train, with "
     "the weights one version behind", NULL},
    {"rl.exchange_timeout", KEY_REAL, F(rl.exchange_timeout),
     "with rl.rollout_ranks: seconds the trainers wait for samples and the rollout ranks for "
     "weights", NULL},
    {"rl.save_rollouts", KEY_BOOL, F(rl.save_rollouts),
     "write each step's samples (tokens, log-probs, rewards, advantages) under rollouts/", NULL},
    {"reward.type", KEY_CHOICE, F(reward.type), "exact_match or command", REWARD_TYPES},
    {"reward.pattern", KEY_STRING, F(reward.pattern),
     "exact_match: PCRE2 pattern whose group 1 (else whole match) is the response's answer", NULL},
    {"reward.command", KEY_STRING, F(reward.command),
     "command: a process reading JSON requests on stdin, answering {\"reward\": x} per line", NULL},
    {"reward.timeout", KEY_REAL, F(reward.timeout), "command: seconds to wait for an answer", NULL},
    {"reward.processes", KEY_INT, F(reward.processes),
     "command: processes of the command per rank; each response goes to the one with the "
     "fewest unanswered", NULL},
    {"reward.overlap", KEY_BOOL, F(reward.overlap),
     "score each response as soon as its sample finishes, while the rest generate (false: all "
     "after the rollout)", NULL},
    {"device", KEY_CHOICE, F(device), "where the model runs: cpu (fp32) or cuda (bf16, one GPU per rank)",
     DEVICES},
    {"device_timeout", KEY_REAL, F(device_timeout),
     "device=cuda: seconds the host waits for queued GPU work before the job ends as stuck; 0: no "
     "limit", NULL},
    {"resume", KEY_STRING, F(resume), "run directory or checkpoint to continue from", NULL},
    {"optim.lr", KEY_REAL, F(optim.lr), "peak learning rate", NULL},
    {"optim.min_lr", KEY_REAL, F(optim.min_lr), "learning rate at the end of cosine decay", NULL},
    {"optim.warmup_steps", KEY_INT, F(optim.warmup_steps), "linear warmup steps", NULL},
    {"optim.beta1", KEY_REAL, F(optim.beta1), "AdamW beta1", NULL},
    {"optim.beta2", KEY_REAL, F(optim.beta2), "AdamW beta2", NULL},
    {"optim.eps", KEY_REAL, F(optim.eps), "AdamW epsilon", NULL},
    {"optim.weight_decay", KEY_REAL, F(optim.weight_decay), "decoupled weight decay", NULL},
    {"optim.clip_grad", KEY_REAL, F(optim.clip_grad), "global gradient-norm clip, 0 = off", NULL},
};
#undef F
enum { N_KEYS = sizeof KEYS / sizeof KEYS[0] };

// The built-in default job: a ~1M-parameter model learning multi-step addition from scratch.
weft_job_config weft_job_config_default(void) {
    weft_job_config c = {0};
    c.model.arch = (weft_model_config){.hidden_size = 128, .intermediate_size = 384,
                                       .num_layers = 4, .num_heads = 4, .num_kv_heads = 2,
                                       .rope_theta = 10000.0, .rms_norm_eps = 1e-6,
                                       .tie_word_embeddings = true, .attention_bias = true,
                                       .mtp_loss_scale = 0.1, .eos_token_id = -1};
    snprintf(c.data.source, sizeof c.data.source, "synthetic");
    c.data.synthetic_documents = 20000;
    c.train.steps = 1000;
    c.train.global_batch_size = 32;
    c.train.max_tokens_per_microbatch = 4096;
    c.train.micro_batches = 1;
    c.train.seed = 1234;
    snprintf(c.train.output_dir, sizeof c.train.output_dir, "runs/default");
    c.train.save_every = 250;
    c.train.save_shard_mb = 5000; // transformers' default max_shard_size, "5GB"
    c.train.log_every = 10;
    c.parallel = weft_parallel_config_default();
    c.optim = weft_optim_config_default();
    c.optim.lr = 1e-3; // 3e-3 left the default model at loss 1.34 after 300 steps, this 0.98
    c.optim.min_lr = 1e-4;
    c.optim.warmup_steps = 20;
    c.sampling = weft_sampling_config_default();
    c.rollout = weft_rollout_config_default();
    c.rl = weft_rl_config_default();
    c.reward = weft_reward_config_default();
    c.device_timeout = WEFT_DEVICE_TIMEOUT;
    return c;
}

static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    int *row = weft_alloc(sizeof(int) * (lb + 1));
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    int d = row[lb];
    weft_free(row);
    return d;
}

// Names other frameworks use for a key's last component (Hugging Face, PyTorch, verl).
static const char *const SYNONYMS[][2] = {
    {"learning_rate", "lr"}, {"min_learning_rate", "min_lr"}, {"lr_min", "min_lr"},
    {"max_grad_norm", "clip_grad"}, {"grad_clip", "clip_grad"}, {"gradient_clipping", "clip_grad"},
    {"warmup", "warmup_steps"}, {"num_warmup_steps", "warmup_steps"}, {"max_steps", "steps"},
    {"num_steps", "steps"}, {"train_steps", "steps"}, {"batch_size", "global_batch_size"},
    {"train_batch_size", "global_batch_size"}, {"num_hidden_layers", "num_layers"},
    {"num_attention_heads", "num_heads"}, {"num_key_value_heads", "num_kv_heads"},
    {"num_nextn_predict_layers", "mtp_layers"}, {"output_path", "output_dir"},
};

static const char *last_component(const char *key) {
    const char *dot = strrchr(key, '.');
    return dot ? dot + 1 : key;
}

// How far `key` is from a known key: the last components first (after synonyms: learning_rate is
// lr), then the section, then the whole key, so optim.learning_rate finds optim.lr.
static int key_distance(const char *known, const char *key) {
    const char *last = last_component(key);
    for (size_t i = 0; i < sizeof SYNONYMS / sizeof SYNONYMS[0]; i++)
        if (strcmp(last, SYNONYMS[i][0]) == 0) last = SYNONYMS[i][1];
    size_t section = (size_t)(last_component(key) - key), known_section =
        (size_t)(last_component(known) - known);
    bool same_section = section == known_section && strncmp(key, known, section) == 0;
    return 1000 * edit_distance(last_component(known), last) + 100 * !same_section +
           edit_distance(known, key);
}

static const key_def *find_key(const char *key, const char *source) {
    const key_def *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(KEYS[i].key, key) == 0) return &KEYS[i];
        int d = key_distance(KEYS[i].key, key);
        if (d < best_d) best_d = d, best = &KEYS[i];
    }
    weft_fatal("%s: unknown config key \"%s\"; did you mean \"%s\" (%s)?", source, key, best->key,
               best->help);
}

// A list value: a JSON array of numbers or strings, or one bare value.
static void set_list(void *cfg, const key_def *k, const char *value, const char *source) {
    const list_def *l = k->extra;
    json_error_t err;
    json_t *list = value[0] == '[' ? json_loads(value, 0, &err) : json_pack("[s]", value);
    WEFT_CHECK(json_is_array(list), "%s: %s=%s: expected a JSON list such as %s", source, k->key,
               value, k->type == KEY_INTS ? "[1, 2]" : "[\"###\", \"\\n\"]");
    int n = (int)json_array_size(list);
    WEFT_CHECK(n <= l->capacity, "%s: %s: at most %d entries", source, k->key, l->capacity);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(list, i);
        const char *text = json_string_value(v);
        if (k->type == KEY_STRINGS) {
            WEFT_CHECK(text && strlen(text) > 0 && strlen(text) < (size_t)l->entry_len,
                       "%s: %s[%d]: expected a string of 1 to %d bytes", source, k->key, i,
                       l->entry_len - 1);
            snprintf((char *)cfg + k->offset + (size_t)i * l->entry_len, l->entry_len, "%s", text);
        } else {
            char *end = NULL;
            long id = json_is_integer(v) ? (long)json_integer_value(v) : text ? strtol(text, &end, 10) : -1;
            WEFT_CHECK(id >= 0 && id < (1L << 30) && (!end || !*end),
                       "%s: %s[%d]: expected a non-negative integer", source, k->key, i);
            ((int *)((char *)cfg + k->offset))[i] = (int)id;
        }
    }
    *(int *)((char *)cfg + l->count_offset) = n;
    json_decref(list);
}

void weft_job_config_set(weft_job_config *cfg, const char *key, const char *value,
                         const char *source) {
    const key_def *k = find_key(key, source);
    char *end = NULL;
    void *dst = (char *)cfg + k->offset;
    errno = 0;
    switch (k->type) {
    case KEY_INT: {
        long v = strtol(value, &end, 10);
        WEFT_CHECK(*value && !*end && errno == 0 && v >= 0 && v <= 1L << 30,
                   "%s: %s=%s: expected a non-negative integer", source, key, value);
        *(int *)dst = (int)v;
        break;
    }
    case KEY_REAL: {
        double v = strtod(value, &end);
        WEFT_CHECK(*value && !*end && errno == 0 && isfinite(v), "%s: %s=%s: expected a number",
                   source, key, value);
        *(double *)dst = v;
        break;
    }
    case KEY_STRING:
        WEFT_CHECK(strlen(value) < WEFT_PATH_MAX, "%s: %s: value too long", source, key);
        snprintf(dst, WEFT_PATH_MAX, "%s", value);
        break;
    case KEY_CHOICE: {
        int i = 0;
        while (((const char *const *)k->extra)[i] && strcmp(((const char *const *)k->extra)[i], value)) i++;
        if (!((const char *const *)k->extra)[i]) {
            char all[256] = "";
            for (int j = 0; ((const char *const *)k->extra)[j]; j++)
                snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", j ? ", " : "",
                         ((const char *const *)k->extra)[j]);
            weft_fatal("%s: %s=%s: expected one of %s", source, key, value, all);
        }
        *(int *)dst = i;
        break;
    }
    case KEY_BOOL:
        if (!strcasecmp(value, "true") || !strcmp(value, "1")) *(bool *)dst = true;
        else if (!strcasecmp(value, "false") || !strcmp(value, "0")) *(bool *)dst = false;
        else weft_fatal("%s: %s=%s: expected true or false", source, key, value);
        break;
    case KEY_STRINGS:
    case KEY_INTS: set_list(cfg, k, value, source); break;
    }
}

void weft_job_config_apply_overrides(weft_job_config *cfg, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        WEFT_CHECK(eq && eq != argv[i], "argument \"%s\": expected key=value", argv[i]);
        char key[128];
        size_t n = (size_t)(eq - argv[i]);
        WEFT_CHECK(n < sizeof key, "argument \"%s\": key too long", argv[i]);
        memcpy(key, argv[i], n);
        key[n] = '\0';
        weft_job_config_set(cfg, key, eq + 1, "command line");
    }
}

void weft_job_config_validate(const weft_job_config *c) {
    WEFT_CHECK(c->train.micro_batches >= 1, "train.micro_batches must be at least 1");
    WEFT_CHECK(c->train.global_batch_size >= 1, "train.global_batch_size must be at least 1");
    WEFT_CHECK(c->parallel.context_parallel_size >= 1,
               "parallel.context_parallel_size must be at least 1 (got %d)",
               c->parallel.context_parallel_size);
    WEFT_CHECK(c->optim.lr >= 0 && c->optim.min_lr >= 0 && c->optim.min_lr <= c->optim.lr,
               "optim.min_lr (%g) must lie in [0, optim.lr = %g]", c->optim.min_lr, c->optim.lr);
    WEFT_CHECK(c->optim.beta1 >= 0 && c->optim.beta1 < 1 && c->optim.beta2 >= 0 &&
                   c->optim.beta2 < 1,
               "optim.beta1 and optim.beta2 must lie in [0, 1)");
    WEFT_CHECK(c->optim.eps > 0, "optim.eps must be positive");
    WEFT_CHECK(c->train.save_shard_mb > 0 && c->train.save_shard_mb <= 1e9,
               "train.save_shard_mb=%g: the weights' shard size must be positive (MB; 5000 is "
               "transformers' 5GB)", c->train.save_shard_mb);
    WEFT_CHECK(isfinite(c->device_timeout) && c->device_timeout >= 0,
               "device_timeout = %g must be a number of seconds (0: no limit)", c->device_timeout);
    const weft_model_config *a = &c->model.arch;
    WEFT_CHECK(c->model.path[0] || (a->num_heads > 0 && a->num_kv_heads > 0 &&
                                    (a->head_dim > 0 || a->hidden_size % a->num_heads == 0) &&
                                    a->num_heads % a->num_kv_heads == 0),
               "model.hidden_size (%d) must be a multiple of model.num_heads (%d) (or set "
               "model.head_dim), and model.num_heads a multiple of model.num_kv_heads (%d)",
               a->hidden_size, a->num_heads, a->num_kv_heads);
    weft_sampling_config_validate(&c->sampling);
    weft_rl_config_validate(&c->rl);
    WEFT_CHECK(c->rollout.block_size >= 1 && c->rollout.max_batch_tokens >= 1 &&
                   c->rollout.kv_cache_fraction > 0 && c->rollout.kv_cache_fraction <= 1,
               "rollout.block_size and rollout.max_batch_tokens must be at least 1, and "
               "rollout.kv_cache_fraction in (0, 1]");
}

// The run directory a resume= path names: the path itself, or for one of its checkpoints
// (RUN/checkpoints/step_N, which holds trainer_state.json) the directory two levels up.
static void run_dir_of(const char *resume, char *run, size_t size) {
    char state[WEFT_PATH_MAX + 32];
    snprintf(state, sizeof state, "%s/trainer_state.json", resume);
    snprintf(run, size, "%s", resume);
    if (access(state, F_OK) != 0) return;
    size_t n = strlen(run);
    while (n > 1 && run[n - 1] == '/') run[--n] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(run, '/');
        if (!slash) { snprintf(run, size, "%s", up == 0 ? "." : ".."); return; }
        *slash = '\0';
    }
    if (!run[0]) snprintf(run, size, "/");
}

static bool same_directory(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    if (!realpath(a, ra) || !realpath(b, rb)) return strcmp(a, b) == 0;
    return strcmp(ra, rb) == 0;
}

// resume=RUN continues RUN in place with the settings it ran with: the defaults, RUN's saved
// config.yaml, then this command's file and overrides on top (a larger train.steps, say). A job
// rebuilt from the defaults alone would be another model, and another output directory would
// truncate or mix runs. `wanted`: the settings as the command gave them.
static void resume_settings(weft_job_config *cfg, const weft_job_config *defaults,
                            const weft_job_config *wanted, const char *config_path,
                            int n_overrides, char **overrides) {
    char run[WEFT_PATH_MAX], saved[WEFT_PATH_MAX + 16];
    run_dir_of(wanted->resume, run, sizeof run);
    snprintf(saved, sizeof saved, "%s/config.yaml", run);
    WEFT_CHECK(access(saved, R_OK) == 0, "resume=%s: %s has no config.yaml, so it is not a weft "
               "run directory; give the train.output_dir of the run to continue", wanted->resume,
               run);
    WEFT_CHECK(strcmp(wanted->train.output_dir, defaults->train.output_dir) == 0 ||
                   same_directory(wanted->train.output_dir, run),
               "resume=%s continues that run in %s, but train.output_dir=%s; drop "
               "train.output_dir (to start a new run from its weights, use model.path=%s/"
               "checkpoints/step_N)", wanted->resume, run, wanted->train.output_dir, run);
    *cfg = *defaults;
    weft_job_config_load_yaml(cfg, saved);
    if (config_path) weft_job_config_load_yaml(cfg, config_path);
    weft_job_config_apply_overrides(cfg, n_overrides, overrides);
    snprintf(cfg->train.output_dir, sizeof cfg->train.output_dir, "%s", run);
}

void weft_job_config_resolve(weft_job_config *cfg, const char *config_path, int n_overrides,
                             char **overrides) {
    const weft_job_config defaults = *cfg;
    if (config_path) weft_job_config_load_yaml(cfg, config_path);
    weft_job_config_apply_overrides(cfg, n_overrides, overrides);
    if (cfg->resume[0]) {
        const weft_job_config wanted = *cfg;
        resume_settings(cfg, &defaults, &wanted, config_path, n_overrides, overrides);
    }
    weft_job_config_validate(cfg);
}

// ------------------------------------------------------------------------------------ YAML ----

// A settings file nests a few levels (section.key) and has at most a few hundred values. YAML
// aliases make the document a graph: a cycle (a: &x {b: *x}) would recurse forever and an alias
// bomb (each level referring to the one below twice) expands exponentially, so the walk stops at
// these bounds with an error rather than crash or spin.
enum { YAML_MAX_DEPTH = 16, YAML_MAX_NODES = 10000 };

typedef struct yaml_walk_ctx {
    weft_job_config *cfg;
    yaml_document_t *doc;
    const char *path;
    int visited; // nodes walked so far, aliases counted every time they are reached
} yaml_walk_ctx;

// A list setting: a YAML sequence of plain values, set as a JSON array.
static void yaml_set_list(yaml_walk_ctx *w, yaml_node_t *node, const char *key, const char *where) {
    json_t *list = json_array();
    for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top;
         it++) {
        yaml_node_t *v = yaml_document_get_node(w->doc, *it);
        WEFT_CHECK(v && v->type == YAML_SCALAR_NODE, "%s: %s: a list of plain values", where, key);
        json_array_append_new(list, json_string((const char *)v->data.scalar.value));
    }
    char *text = json_dumps(list, JSON_COMPACT);
    weft_job_config_set(w->cfg, key, text, where);
    free(text);
    json_decref(list);
}

// Walks nested mappings, joining keys with dots, and sets every scalar leaf.
static void yaml_walk(yaml_walk_ctx *w, yaml_node_t *node, const char *prefix, int depth) {
    char where[WEFT_PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%lu", w->path, (unsigned long)node->start_mark.line + 1);
    WEFT_CHECK(depth <= YAML_MAX_DEPTH,
               "%s: settings nest deeper than %d levels (at \"%.64s\"); an alias refers to "
               "itself, or the file is not a weft config", where, YAML_MAX_DEPTH, prefix);
    WEFT_CHECK(++w->visited <= YAML_MAX_NODES,
               "%s: the file expands to more than %d values (aliases repeated over and over?); "
               "a weft config has a few hundred at most", where, YAML_MAX_NODES);
    if (node->type == YAML_SCALAR_NODE) {
        WEFT_CHECK(prefix[0], "%s: expected a mapping of settings, found a bare value", where);
        weft_job_config_set(w->cfg, prefix, (const char *)node->data.scalar.value, where);
        return;
    }
    if (node->type == YAML_SEQUENCE_NODE && prefix[0]) {
        yaml_set_list(w, node, prefix, where);
        return;
    }
    WEFT_CHECK(node->type == YAML_MAPPING_NODE, "%s: %s: lists are not settings; use key: value",
               where, prefix[0] ? prefix : "top level");
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        WEFT_CHECK(k && v && k->type == YAML_SCALAR_NODE, "%s: keys must be plain names", where);
        char key[256];
        int n = snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "",
                         (const char *)k->data.scalar.value);
        WEFT_CHECK(n >= 0 && (size_t)n < sizeof key, "%s: key \"%.64s...\" is too long", where,
                   key);
        yaml_walk(w, v, key, depth + 1);
    }
}

void weft_job_config_load_yaml(weft_job_config *cfg, const char *path) {
    FILE *f = weft_open_input(path, "the config file (--config)");
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        fclose(f);
        weft_fatal("%s:%lu:%lu: malformed YAML: %s; fix the file", path,
                   (unsigned long)parser.problem_mark.line + 1,
                   (unsigned long)parser.problem_mark.column + 1,
                   parser.problem ? parser.problem : "parse error");
    }
    fclose(f);
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_walk_ctx w = {.cfg = cfg, .doc = &doc, .path = path};
    if (root) yaml_walk(&w, root, "", 0);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
}

// A value as JSON text (valid YAML: strings escaped, lists in flow style); releases v.
static void quoted(char *out, size_t size, json_t *v) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(out, size, "%s", text ? text : "\"\"");
    free(text);
    json_decref(v);
}

static json_t *list_json(const weft_job_config *cfg, const key_def *k) {
    const list_def *l = k->extra;
    json_t *list = json_array();
    int n = *(const int *)((const char *)cfg + l->count_offset);
    for (int i = 0; i < n; i++) {
        const char *at = (const char *)cfg + k->offset;
        json_array_append_new(list, k->type == KEY_INTS ? json_integer(((const int *)at)[i])
                                                        : json_string(at + (size_t)i * l->entry_len));
    }
    return list;
}

// The shortest text that reads back as exactly x: 0.003, not 0.0030000000000000001.
static void shortest_real(char *out, size_t size, double x) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, size, "%.*g", digits, x);
        if (strtod(out, NULL) == x) return;
    }
}

bool weft_job_config_save_yaml(const weft_job_config *cfg, const char *path) {
    size_t cap = 16384, len = 0;
    char *buf = weft_alloc(cap);
    for (int i = 0; i < N_KEYS; i++) {
        const void *src = (const char *)cfg + KEYS[i].offset;
        char value[WEFT_PATH_MAX + 8];
        const list_def *l = KEYS[i].type == KEY_INTS ? KEYS[i].extra : NULL;
        if (l && *(const int *)((const char *)cfg + l->count_offset) < 0) continue; // unset
        switch (KEYS[i].type) {
        case KEY_INT: snprintf(value, sizeof value, "%d", *(const int *)src); break;
        case KEY_REAL: shortest_real(value, sizeof value, *(const double *)src); break;
        case KEY_BOOL: snprintf(value, sizeof value, "%s", *(const bool *)src ? "true" : "false"); break;
        case KEY_STRING: quoted(value, sizeof value, json_string((const char *)src)); break;
        case KEY_CHOICE: snprintf(value, sizeof value, "%s", ((const char *const *)KEYS[i].extra)[*(const int *)src]); break;
        case KEY_STRINGS:
        case KEY_INTS: quoted(value, sizeof value, list_json(cfg, &KEYS[i])); break;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s: %s\n", KEYS[i].key, value);
        WEFT_CHECK(len < cap, "internal: config too large to save");
    }
    bool ok = weft_write_file_atomic(path, buf, len);
    weft_free(buf);
    return ok;
}
