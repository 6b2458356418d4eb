#include "train/config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { KEY_INT, KEY_REAL, KEY_BOOL } key_type;

typedef struct key_def {
    const char *key;
    key_type type;
    size_t offset;
    const char *help;
} key_def;

#define FIELD(f) offsetof(weft_job_config, f)
static const key_def KEYS[] = {
    {"train.micro_batches", KEY_INT, FIELD(micro_batches), "micro-batches per global batch"},
    {"train.recompute", KEY_BOOL, FIELD(recompute), "recompute block activations in backward"},
    {"train.steps", KEY_INT, FIELD(steps), "optimizer steps"},
    {"optim.lr", KEY_REAL, FIELD(optim.lr), "peak learning rate"},
    {"optim.min_lr", KEY_REAL, FIELD(optim.min_lr), "learning rate at the end of cosine decay"},
    {"optim.warmup_steps", KEY_INT, FIELD(optim.warmup_steps), "linear warmup steps"},
    {"optim.beta1", KEY_REAL, FIELD(optim.beta1), "AdamW beta1"},
    {"optim.beta2", KEY_REAL, FIELD(optim.beta2), "AdamW beta2"},
    {"optim.eps", KEY_REAL, FIELD(optim.eps), "AdamW epsilon"},
    {"optim.weight_decay", KEY_REAL, FIELD(optim.weight_decay), "decoupled weight decay"},
    {"optim.clip_grad", KEY_REAL, FIELD(optim.clip_grad), "global gradient-norm clip, 0 = off"},
};
#undef FIELD
enum { N_KEYS = sizeof KEYS / sizeof KEYS[0] };

weft_job_config weft_job_config_default(void) {
    return (weft_job_config){.micro_batches = 1, .recompute = false, .steps = 0,
                             .optim = weft_optim_config_default()};
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

static const key_def *find_key(const char *key, const char *source) {
    const key_def *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(KEYS[i].key, key) == 0) return &KEYS[i];
        int d = edit_distance(KEYS[i].key, key);
        if (d < best_d) best_d = d, best = &KEYS[i];
    }
    weft_fatal("%s: unknown config key \"%s\"; did you mean \"%s\" (%s)?", source, key, best->key,
               best->help);
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
    case KEY_BOOL:
        if (!strcasecmp(value, "true") || !strcmp(value, "1")) *(bool *)dst = true;
        else if (!strcasecmp(value, "false") || !strcmp(value, "0")) *(bool *)dst = false;
        else weft_fatal("%s: %s=%s: expected true or false", source, key, value);
        break;
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
    WEFT_CHECK(c->micro_batches >= 1, "train.micro_batches must be at least 1");
    WEFT_CHECK(c->optim.lr >= 0 && c->optim.min_lr >= 0 && c->optim.min_lr <= c->optim.lr,
               "optim.min_lr (%g) must lie in [0, optim.lr = %g]", c->optim.min_lr, c->optim.lr);
    WEFT_CHECK(c->optim.beta1 >= 0 && c->optim.beta1 < 1 && c->optim.beta2 >= 0 &&
                   c->optim.beta2 < 1,
               "optim.beta1 and optim.beta2 must lie in [0, 1)");
    WEFT_CHECK(c->optim.eps > 0, "optim.eps must be positive");
}
