#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "train/job.h"

// Files every checkpoint holds; the weights are model.safetensors or, sharded, an index and the
// shards it lists, and files copied from the model's directory may sit beside them. Every file is
// recorded in trainer_state.json.
static const char *const REQUIRED_FILES[] = {"config.json", "optimizer.safetensors"};
enum { N_REQUIRED = 2 };
#define WEIGHTS_FILE "model.safetensors"
#define WEIGHTS_INDEX "model.safetensors.index.json"
#define STATE_FILE "trainer_state.json"

// The files that travel with a tokenizer.json (transformers reads them beside it), copied into a
// checkpoint so that it is a complete Hugging Face model directory.
static const char *const TOKENIZER_FILES[] = {"tokenizer_config.json", "special_tokens_map.json",
                                              "vocab.json", "merges.txt", "added_tokens.json",
                                              "chat_template.jinja"};

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = weft_alloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static uint64_t fnv1a64(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

// Size and hash of a file; false if it cannot be read.
static bool file_digest(const char *path, size_t *bytes, uint64_t *hash) {
    size_t n;
    char *data = weft_read_file(path, &n);
    if (!data) return false;
    *bytes = n;
    *hash = fnv1a64((const unsigned char *)data, n);
    weft_free(data);
    return true;
}

// The weights as fp32: the optimizer's master copy where parameters are low precision (`master`,
// laid out like the whole buffer), so a resumed run continues from exactly these values. Sharded
// as train.save_shard_mb says.
static void save_model_weights(const weft_model *m, const char *dir, const float *master, double shard_mb) {
    weft_safetensors_writer *w = weft_safetensors_writer_create();
    weft_safetensors_writer_add_metadata(w, "format", "pt");
    weft_model_add_tensors(m, w, "", master, 0);
    WEFT_CHECK(weft_safetensors_writer_save_model(w, dir, (size_t)(shard_mb * 1e6)),
               "%s: cannot write checkpoint weights (%s)", dir, strerror(errno));
    weft_safetensors_writer_free(w);
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *data = weft_read_file(from, &n);
    WEFT_CHECK(data, "%s: cannot read it to copy into the checkpoint (%s)", from, strerror(errno));
    WEFT_CHECK(weft_write_file_atomic(to, data, n), "%s: cannot write (%s)", to, strerror(errno));
    weft_free(data);
}

static void copy_if_present(const char *from_dir, const char *name, const char *to_dir) {
    char *from = join(from_dir, name), *to = join(to_dir, name);
    if (access(from, F_OK) == 0) copy_file(from, to);
    weft_free(from);
    weft_free(to);
}

// The tokenizer the job tokenized with: the byte-level one written as files, or data.tokenizer's
// file (else the model directory's tokenizer.json) as tokenizer.json with the files beside it.
static void save_tokenizer_files(const weft_job_config *cfg, const char *dir) {
    if (weft_job_tokenizer_is_bytes(cfg)) {
        WEFT_CHECK(weft_tokenizer_save_byte_level(dir), "%s: cannot write the byte-level "
                   "tokenizer's files (%s)", dir, strerror(errno));
        return;
    }
    char *json = cfg->data.tokenizer[0] ? weft_strdup(cfg->data.tokenizer)
                                        : join(cfg->model.path, "tokenizer.json");
    char *beside = weft_strdup(json), *slash = strrchr(beside, '/');
    if (slash) *slash = '\0';
    if (access(json, F_OK) == 0) {
        char *to = join(dir, "tokenizer.json");
        copy_file(json, to);
        weft_free(to);
    }
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0]; i++)
        copy_if_present(slash ? beside : ".", TOKENIZER_FILES[i], dir);
    weft_free(json);
    weft_free(beside);
}

// config.json as loaded (only what training changed is updated) and generation_config.json when
// the model came from a directory; a model built from scratch gets a complete config. Then the
// job's tokenizer files.
static void save_model_files(const weft_job_config *cfg, const weft_model_config *mc, const char *dir) {
    char *path = join(dir, "config.json");
    if (cfg->model.path[0]) {
        char *source = join(cfg->model.path, "config.json");
        WEFT_CHECK(weft_model_config_save_over(source, mc, "float32", path), "%s: cannot write", path);
        weft_free(source);
        copy_if_present(cfg->model.path, "generation_config.json", dir);
    } else {
        WEFT_CHECK(weft_model_config_save(mc, path), "%s: cannot write", path);
    }
    weft_free(path);
    save_tokenizer_files(cfg, dir);
}

// An optimizer buffer (moment, master weights) laid out like the whole parameter buffer: NULL
// when the optimizer's own already is (it holds every element, and then in buffer order), else
// every rank's part gathered (every rank enters the collective).
static float *whole_moment(const weft_trainer *t, const float *mine) {
    weft_model *m = t->model;
    if (t->opt->numel == m->n_padded) return NULL;
    float *all = m->be->alloc(m->be, m->n_padded * sizeof(float));
    weft_dp_gather_owned(t->dp, mine, all);
    return all;
}

static void save_optimizer(const weft_trainer *t, const char *path, bool writer) {
    const weft_optimizer *o = t->opt;
    float *m_all = whole_moment(t, o->m), *v_all = whole_moment(t, o->v);
    if (writer) {
        weft_safetensors_writer *w = weft_safetensors_writer_create();
        weft_model_add_tensors(t->model, w, "exp_avg.", m_all ? m_all : o->m, 0);
        weft_model_add_tensors(t->model, w, "exp_avg_sq.", v_all ? v_all : o->v, 0);
        WEFT_CHECK(weft_safetensors_writer_save(w, path), "%s: cannot write optimizer state", path);
        weft_safetensors_writer_free(w);
    }
    if (m_all) t->model->be->free(t->model->be, m_all);
    if (v_all) t->model->be->free(t->model->be, v_all);
}

// optimizer_steps: AdamW's step count (its bias correction), which an RL step advances several times.
static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Every file of the checkpoint directory but trainer_state.json, in name order (the same bytes
// whatever order the file system lists them in).
static json_t *digest_files(const char *dir) {
    char **names = NULL;
    int n = 0, cap = 0;
    DIR *d = opendir(dir);
    WEFT_CHECK(d, "%s: cannot list (%s)", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, STATE_FILE) == 0) continue;
        names = weft_grow(names, n, &cap, sizeof *names, 16);
        names[n++] = weft_strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    json_t *files = json_object();
    for (int i = 0; i < n; i++) {
        char *path = join(dir, names[i]);
        size_t bytes;
        uint64_t hash;
        WEFT_CHECK(file_digest(path, &bytes, &hash), "%s: cannot read back", path);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
        json_object_set_new(files, names[i],
                            json_pack("{s:I, s:s}", "bytes", (json_int_t)bytes, "fnv1a64", hex));
        weft_free(path);
        weft_free(names[i]);
    }
    weft_free(names);
    return files;
}

static void save_state(const char *dir, const weft_train_state *s, int optimizer_steps) {
    json_t *files = digest_files(dir);
    json_t *root = json_pack("{s:i, s:i, s:i, s:I, s:I, s:o}", "step", s->step, "optimizer_steps",
                             optimizer_steps, "epoch", s->epoch, "cursor", (json_int_t)s->cursor,
                             "seed", (json_int_t)s->seed, "files", files);
    if (s->has_kl_coef) json_object_set_new(root, "kl_coef", json_real(s->kl_coef));
    char *text = json_dumps(root, JSON_INDENT(2));
    char *path = join(dir, STATE_FILE);
    WEFT_CHECK(weft_write_file_atomic(path, text, strlen(text)), "%s: cannot write", path);
    free(text);
    weft_free(path);
    json_decref(root);
}

// Names in checkpoints/ that a save in progress uses: step_N.tmp (being written) and step_N.old
// (the checkpoint it replaces, kept until the new one is in place).
static bool is_leftover(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "step_", 5) == 0 && n > 4 &&
           (strcmp(name + n - 4, ".tmp") == 0 || strcmp(name + n - 4, ".old") == 0);
}

// After a checkpoint is published, what killed saves left behind (partial .tmp directories,
// replaced .old copies) is no longer needed for resuming: removed, so it neither piles up nor
// gets mistaken for a checkpoint.
static void remove_leftovers(const char *run_dir) {
    char *root = join(run_dir, "checkpoints");
    DIR *d = opendir(root);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!is_leftover(e->d_name)) continue;
        char *dir = join(root, e->d_name);
        if (!weft_remove_tree(dir))
            fprintf(stderr, "weft: warning: cannot remove %s (%s)\n", dir, strerror(errno));
        weft_free(dir);
    }
    if (d) closedir(d);
    weft_free(root);
}

// Moves tmp into final_dir's place. An existing checkpoint of the same step (a resumed run
// re-saving it) is renamed aside first, never deleted in place: a kill at any moment leaves a
// complete copy under step_N or step_N.old, which weft_checkpoint_find accepts.
static void publish(const char *tmp, const char *final_dir) {
    size_t n = strlen(final_dir) + 8;
    char *old = weft_alloc(n);
    snprintf(old, n, "%s.old", final_dir);
    WEFT_CHECK(weft_remove_tree(old), "%s: cannot remove (%s)", old, strerror(errno));
    WEFT_CHECK(rename(final_dir, old) == 0 || errno == ENOENT,
               "%s: cannot move the old checkpoint aside (%s)", final_dir, strerror(errno));
    WEFT_CHECK(rename(tmp, final_dir) == 0, "%s: cannot publish checkpoint (%s)", final_dir,
               strerror(errno));
    weft_free(old);
}

char *weft_checkpoint_save(const char *run_dir, const weft_trainer *t, const weft_train_state *s) {
    bool writer = weft_comm_rank(t->world) == 0;
    char name[64], tmp_name[80];
    snprintf(name, sizeof name, "checkpoints/step_%08d", s->step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp", name);
    char *final_dir = join(run_dir, name), *tmp = join(run_dir, tmp_name);
    char *path = join(tmp, "optimizer.safetensors");
    // A killed save's directory may hold a half-written file (model.safetensors.tmp.PID):
    // start from an empty one, so nothing of it is published with this checkpoint.
    if (writer)
        WEFT_CHECK(weft_remove_tree(tmp) && weft_mkdirs(tmp), "%s: cannot create directory (%s)",
                   tmp, strerror(errno));
    save_optimizer(t, path, writer); // collective: every rank enters, rank 0 writes
    weft_free(path);
    const float *master = t->opt->master;
    float *master_all = master ? whole_moment(t, t->opt->master) : NULL; // collective too
    if (writer) {
        save_model_files(&t->cfg, &t->model->cfg, tmp);
        save_model_weights(t->model, tmp, master_all ? master_all : master, t->cfg.train.save_shard_mb);
        save_state(tmp, s, t->opt ? t->opt->step : s->step);
        publish(tmp, final_dir);
        remove_leftovers(run_dir);
    }
    if (master_all) t->model->be->free(t->model->be, master_all);
    weft_free(tmp);
    return final_dir;
}

// A recorded file matches its size and hash; false with `why` set if not.
static bool file_matches(const char *dir, const char *name, json_t *f, char *why, size_t why_cap) {
    // The names come from the file: only plain names inside the checkpoint are read.
    if (!name[0] || strchr(name, '/') || strcmp(name, "..") == 0 || strcmp(name, ".") == 0) {
        snprintf(why, why_cap, "trainer_state.json records a file named \"%s\"", name);
        return false;
    }
    const char *want_hex = json_string_value(json_object_get(f, "fnv1a64"));
    json_int_t want_bytes = json_integer_value(json_object_get(f, "bytes"));
    char *path = join(dir, name);
    size_t bytes = 0;
    uint64_t hash = 0;
    char hex[17];
    bool ok = file_digest(path, &bytes, &hash);
    weft_free(path);
    if (!ok) {
        snprintf(why, why_cap, "%s is missing", name);
        return false;
    }
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    if (!want_hex || (json_int_t)bytes != want_bytes || strcmp(hex, want_hex) != 0) {
        snprintf(why, why_cap, "%s has %zu bytes (hash %s) but was saved with %lld (%s)", name, bytes, hex,
                 (long long)want_bytes, want_hex ? want_hex : "?");
        return false;
    }
    return true;
}

// A checkpoint is valid when trainer_state.json parses, records the files every checkpoint holds
// (config, optimizer state, the weights or their index) and every file it records matches its
// size and hash. `why` receives the first problem.
static bool checkpoint_valid(const char *dir, char *why, size_t why_cap) {
    char *state = join(dir, STATE_FILE);
    json_t *root = json_load_file(state, 0, NULL);
    weft_free(state);
    if (!root) {
        snprintf(why, why_cap, "trainer_state.json is missing or unreadable");
        return false;
    }
    json_t *files = json_object_get(root, "files");
    bool ok = json_is_object(files);
    if (!ok) snprintf(why, why_cap, "trainer_state.json records no files");
    for (int i = 0; i < N_REQUIRED && ok; i++)
        if (!json_object_get(files, REQUIRED_FILES[i])) {
            snprintf(why, why_cap, "%s is not recorded in trainer_state.json", REQUIRED_FILES[i]);
            ok = false;
        }
    if (ok && !json_object_get(files, WEIGHTS_FILE) && !json_object_get(files, WEIGHTS_INDEX)) {
        snprintf(why, why_cap, "trainer_state.json records neither " WEIGHTS_FILE " nor " WEIGHTS_INDEX);
        ok = false;
    }
    const char *name;
    json_t *f;
    json_object_foreach(files, name, f) {
        if (ok) ok = file_matches(dir, name, f, why, why_cap);
    }
    json_decref(root);
    return ok;
}

// Newest step first; of the same step, step_N before step_N.old (the copy being replaced).
static int by_name_desc(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    long sx = strtol(x + 5, NULL, 10), sy = strtol(y + 5, NULL, 10);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x, y); // "step_N" < "step_N.old"
}

char *weft_checkpoint_find(const char *path) {
    char why[512];
    char *state = join(path, "trainer_state.json");
    bool is_checkpoint = access(state, F_OK) == 0;
    weft_free(state);
    if (is_checkpoint) {
        WEFT_CHECK(checkpoint_valid(path, why, sizeof why),
                   "%s: checkpoint is damaged: %s; resume from an earlier checkpoint", path, why);
        return weft_strdup(path);
    }
    char *root = join(path, "checkpoints");
    DIR *d = opendir(root);
    WEFT_CHECK(d, "resume=%s: no checkpoints/ directory there; give a run directory or a "
                  "checkpoint directory", path);
    char *names[4096];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 4096;)
        if (strncmp(e->d_name, "step_", 5) == 0 && !strstr(e->d_name, ".tmp"))
            names[n++] = weft_strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof names[0], by_name_desc);
    char *found = NULL;
    for (int i = 0; i < n; i++) {
        char *dir = join(root, names[i]);
        if (!found && checkpoint_valid(dir, why, sizeof why)) found = dir;
        else {
            if (!found) fprintf(stderr, "weft: warning: skipping checkpoint %s: %s\n", dir, why);
            weft_free(dir);
        }
        weft_free(names[i]);
    }
    weft_free(root);
    WEFT_CHECK(found, "resume=%s: no complete checkpoint found", path);
    return found;
}

static void check_same_shape(const char *dir, const weft_model_config *want) {
    char *path = join(dir, "config.json");
    weft_model_config got;
    weft_model_config_load(path, &got);
#define SAME(field, key)                                                                           \
    WEFT_CHECK(got.field == want->field,                                                           \
               "%s: the checkpoint's model has " key " = %d but this job's model has %d; resume "   \
               "with the model settings it was trained with",                                      \
               path, (int)got.field, (int)want->field)
    SAME(vocab_size, "vocab_size");
    SAME(hidden_size, "hidden_size");
    SAME(intermediate_size, "intermediate_size");
    SAME(num_layers, "num_hidden_layers");
    SAME(num_heads, "num_attention_heads");
    SAME(num_kv_heads, "num_key_value_heads");
    SAME(head_dim, "head_dim");
    SAME(tie_word_embeddings, "tie_word_embeddings");
    SAME(attention_bias, "attention_bias");
    SAME(num_mtp, "num_nextn_predict_layers");
#undef SAME
    weft_free(path);
}

// Reads one fp32 tensor per parameter (a moment, or the weights themselves with prefix "") into a
// whole-buffer-shaped dst, then keeps this rank's part of it in `own`, in optimizer order.
static void load_moments(const weft_safetensors *st, const char *path, const weft_trainer *tr,
                         const char *prefix, float *own) {
    const weft_model *m = tr->model;
    float *dst = m->be->alloc(m->be, m->n_padded * sizeof(float));
    char name[160];
    for (int i = 0; i < m->n_params; i++) {
        const weft_param_info *p = &m->params[i];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        const weft_st_tensor *t = weft_safetensors_find(st, name);
        WEFT_CHECK(t && weft_st_numel(t) == (int64_t)p->numel,
                   "%s: tensor \"%s\" is missing or has the wrong size", path, name);
        float *host = weft_alloc(p->numel * sizeof(float));
        weft_safetensors_read_f32(st, t, host);
        m->be->to_device(m->be, dst + p->offset, host, p->numel * sizeof(float));
        weft_free(host);
    }
    weft_dp_select_owned(tr->dp, dst, own);
    m->be->free(m->be, dst);
}

weft_train_state weft_checkpoint_load(const char *dir, weft_trainer *t) {
    check_same_shape(dir, &t->model->cfg);
    weft_model_load_safetensors(t->model, dir); // model.safetensors or its shards
    if (t->opt->master) { // the fp32 weights, not their low-precision rounding
        weft_safetensors *st = weft_safetensors_open_model(dir);
        load_moments(st, dir, t, "", t->opt->master);
        weft_safetensors_free(st);
    }
    char *path = join(dir, "optimizer.safetensors");
    weft_safetensors *st = weft_safetensors_load(path);
    load_moments(st, path, t, "exp_avg.", t->opt->m);
    load_moments(st, path, t, "exp_avg_sq.", t->opt->v);
    weft_safetensors_free(st);
    weft_free(path);

    path = join(dir, STATE_FILE);
    weft_train_state s = weft_checkpoint_read_state(path);
    weft_free(path);
    t->opt->step = s.optimizer_steps;
    return s;
}

// A non-negative integer field of trainer_state.json below `limit`.
static json_int_t state_field(json_t *root, const char *path, const char *key, json_int_t limit) {
    json_t *v = json_object_get(root, key);
    WEFT_CHECK(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < limit,
               "%s: \"%s\" is missing or not an integer in [0, %lld); the checkpoint is damaged, "
               "resume from an earlier one", path, key, (long long)limit);
    return json_integer_value(v);
}

weft_train_state weft_checkpoint_read_state(const char *path) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    WEFT_CHECK(root, "%s: unreadable (%s); the checkpoint is damaged, resume from an earlier one",
               path, err.text);
    weft_train_state s = {
        .step = (int)state_field(root, path, "step", INT32_MAX),
        .epoch = (int)state_field(root, path, "epoch", INT32_MAX),
        .cursor = (long)state_field(root, path, "cursor", INT64_MAX),
        // The seed is a uint64 saved through a signed JSON integer: any value is one.
        .seed = (uint64_t)json_integer_value(json_object_get(root, "seed")),
    };
    s.optimizer_steps = json_object_get(root, "optimizer_steps")
                            ? (int)state_field(root, path, "optimizer_steps", INT32_MAX)
                            : s.step; // saved before RL: one update per step
    json_t *kl = json_object_get(root, "kl_coef");
    if (kl) {
        WEFT_CHECK(json_is_number(kl) && isfinite(json_number_value(kl)) &&
                       json_number_value(kl) > 0,
                   "%s: \"kl_coef\" is not a positive number; the checkpoint is damaged, resume "
                   "from an earlier one", path);
        s.has_kl_coef = true, s.kl_coef = json_number_value(kl);
    }
    json_decref(root);
    return s;
}
