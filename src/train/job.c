#include "train/job.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "train/step.h"

bool weft_job_tokenizer_is_bytes(const weft_job_config *cfg) {
    return strcmp(cfg->data.tokenizer, "bytes") == 0 || (!cfg->data.tokenizer[0] && !cfg->model.path[0]);
}

// A model directory's own tokenizer is the default: training a Hugging Face model on bytes
// because nobody said otherwise gives a model that reads nothing its users write.
weft_tokenizer *weft_job_tokenizer(const weft_job_config *cfg) {
    if (weft_job_tokenizer_is_bytes(cfg)) return weft_tokenizer_byte_level();
    if (cfg->data.tokenizer[0]) return weft_tokenizer_load(cfg->data.tokenizer);
    char path[WEFT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tokenizer.json", cfg->model.path);
    return access(path, F_OK) == 0 ? weft_tokenizer_load(path) : NULL;
}

int weft_job_vocab_size(const weft_job_config *cfg, const weft_tokenizer *tok) {
    if (!cfg->model.path[0]) return weft_tokenizer_vocab_size(tok);
    weft_model_config mc;
    weft_job_model_config(cfg, tok ? weft_tokenizer_vocab_size(tok) : 0, &mc);
    return mc.vocab_size;
}

weft_document_set *weft_job_load_data(const weft_job_config *cfg, int world,
                                      weft_tokenizer **tok) {
    *tok = weft_job_tokenizer(cfg);
    char why[192];
    weft_dataset_options dopt = {
        .source = cfg->data.source,
        .synthetic_documents = cfg->data.synthetic_documents,
        .seed = (uint64_t)cfg->train.seed,
        .max_len = weft_trainer_max_document_len(cfg, world, why, sizeof why),
        .max_len_why = why,
        .truncate = cfg->data.truncate,
        .vocab_size = weft_job_vocab_size(cfg, *tok),
    };
    return weft_dataset_load(&dopt, *tok);
}

// ------------------------------------------------------------------------------ data order ----

static void shuffle_epoch(weft_data_order *o) {
    weft_rng rng;
    weft_rng_seed(&rng, o->seed * 1000003ULL + (uint64_t)o->epoch);
    for (int i = 0; i < o->n; i++) o->perm[i] = i;
    for (int i = o->n - 1; i > 0; i--) {
        int j = (int)(weft_rng_next(&rng) % (uint64_t)(i + 1)), t = o->perm[i];
        o->perm[i] = o->perm[j], o->perm[j] = t;
    }
}

void weft_data_order_start(weft_data_order *o, int n, uint64_t seed, int epoch, long cursor) {
    *o = (weft_data_order){.n = n, .perm = weft_alloc(sizeof(int) * (n > 0 ? n : 1)),
                           .seed = seed, .epoch = epoch, .cursor = cursor};
    shuffle_epoch(o);
}

void weft_data_order_take(weft_data_order *o, int batch_size, int *out) {
    WEFT_CHECK(batch_size <= o->n, "a batch of %d is more than the %d items of the data; lower "
               "the batch size (train.global_batch_size) or give more data", batch_size, o->n);
    if (o->cursor + batch_size > o->n) { // the epoch's last, partial batch is left out
        o->epoch++;
        o->cursor = 0;
        shuffle_epoch(o);
    }
    for (int k = 0; k < batch_size; k++) out[k] = o->perm[o->cursor++];
}

void weft_data_order_next(weft_data_order *o, const weft_document_set *set, weft_document *out,
                          int batch_size) {
    int *index = weft_alloc(sizeof(int) * (batch_size > 0 ? batch_size : 1));
    weft_data_order_take(o, batch_size, index);
    for (int k = 0; k < batch_size; k++) out[k] = set->docs[index[k]];
    weft_free(index);
}

void weft_data_order_free(weft_data_order *o) {
    weft_free(o->perm);
    o->perm = NULL;
}

void weft_job_first_batch(const weft_job_config *cfg, const weft_document_set *data,
                          weft_document *out) {
    weft_data_order order;
    weft_data_order_start(&order, data->n, (uint64_t)cfg->train.seed, 0, 0);
    weft_data_order_next(&order, data, out, cfg->train.global_batch_size);
    weft_data_order_free(&order);
}

// --------------------------------------------------------------------------------- model ----

void weft_job_model_config(const weft_job_config *cfg, int vocab, weft_model_config *mc) {
    char path[WEFT_PATH_MAX + 32];
    if (cfg->model.path[0]) {
        snprintf(path, sizeof path, "%s/config.json", cfg->model.path);
        weft_model_config_load(path, mc);
        WEFT_CHECK(mc->vocab_size >= vocab,
                   "%s: vocab_size %d is smaller than the tokenizer's %d; use the model's tokenizer",
                   path, mc->vocab_size, vocab);
        return;
    }
    *mc = cfg->model.arch;
    mc->vocab_size = vocab;
    if (mc->head_dim == 0 && mc->num_heads > 0) mc->head_dim = mc->hidden_size / mc->num_heads;
    weft_model_config_validate(mc, "model settings");
}

weft_backend *weft_job_backend(const weft_job_config *cfg, weft_comm *world) {
    weft_backend *be = weft_backend_create(cfg->device, weft_comm_local_rank(world));
    weft_backend_set_wait_timeout(be, cfg->device_timeout);
    weft_comm_use_backend(world, be);
    return be;
}

weft_model *weft_job_build_model(weft_backend *be, const weft_comm *world,
                                 const weft_job_config *cfg, int vocab, bool forward_only) {
    weft_model_config mc;
    weft_job_model_config(cfg, vocab, &mc);
    weft_model *m = weft_trainer_build_model(be, world, &mc, cfg, forward_only);
    if (cfg->model.path[0]) weft_model_load_safetensors(m, cfg->model.path);
    else weft_model_init_random(m, (uint64_t)cfg->train.seed);
    return m;
}
