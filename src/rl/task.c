#include "rl/task.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "data/jsonl.h"
#include "data/synthetic.h"

static void add_prompt(weft_rl_prompts *set, int *cap, const weft_tokenizer *tok, const char *text,
                       const char *answer, char *row, const char *name) {
    if (set->n == *cap) set->p = weft_grow(set->p, set->n, cap, sizeof *set->p, 64);
    weft_rl_prompt *p = &set->p[set->n++];
    *p = (weft_rl_prompt){.text = weft_strdup(text), .answer = answer ? weft_strdup(answer) : NULL,
                          .row = row};
    snprintf(p->name, sizeof p->name, "%s", name);
    WEFT_CHECK(*text, "%s: the prompt is empty; give at least one token", name);
    p->tokens = weft_tokenizer_encode_special(tok, text, strlen(text), &p->len);
}

// Problems of rl.min_terms .. rl.max_terms terms below rl.term_below; the held-out ones come from
// another stream.
static weft_rl_prompts *synthetic_prompts(const weft_job_config *cfg, const weft_tokenizer *tok,
                                          bool held_out) {
    weft_rl_prompts *set = weft_alloc(sizeof *set);
    int cap = 0, n = held_out ? cfg->rl.eval_prompts : cfg->data.synthetic_documents;
    weft_rng rng;
    weft_rng_seed(&rng, (uint64_t)cfg->train.seed * 7919 + (held_out ? 0x5eedULL : 0x7a1bULL));
    char prompt[1024], response[2048], answer[32], name[64];
    for (int i = 0; i < n; i++) {
        int span = cfg->rl.max_terms - cfg->rl.min_terms + 1;
        int terms = cfg->rl.min_terms + (int)(weft_rng_next(&rng) % (uint64_t)span);
        long sum = weft_synthetic_addition_of(&rng, terms, cfg->rl.term_below, prompt,
                                              sizeof prompt, response, sizeof response);
        snprintf(answer, sizeof answer, "%ld", sum);
        snprintf(name, sizeof name, "synthetic %s problem %d", held_out ? "held-out" : "RL", i + 1);
        add_prompt(set, &cap, tok, prompt, answer, NULL, name);
    }
    return set;
}

// The row's "data_source" into out (at most 63 bytes; none: "").
static void data_source_of(json_t *row, const char *where, char out[64]) {
    json_t *s = json_object_get(row, "data_source");
    out[0] = '\0';
    if (!s) return;
    WEFT_CHECK(json_is_string(s) && strlen(json_string_value(s)) < 64, "%s: \"data_source\" must "
               "be a string of at most 63 bytes (it names a group of the held-out metrics)", where);
    snprintf(out, 64, "%s", json_string_value(s));
}

static char *answer_of(json_t *row, const char *where) {
    json_t *a = json_object_get(row, "answer");
    if (!a) return NULL;
    if (json_is_string(a)) return weft_strdup(json_string_value(a));
    WEFT_CHECK(json_is_number(a), "%s: \"answer\" must be a string or a number", where);
    char *text = json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT);
    char *copy = weft_strdup(text);
    free(text);
    return copy;
}

static weft_rl_prompts *file_prompts(const weft_job_config *cfg, const weft_tokenizer *tok) {
    const char *path = cfg->data.source;
    weft_jsonl_reader *r = weft_jsonl_open(path, "the prompts (data.source)",
                                           "{\"prompt\": \"...\", \"answer\": \"...\"}");
    weft_rl_prompts *set = weft_alloc(sizeof *set);
    int cap = 0;
    for (json_t *row; (row = weft_jsonl_next(r));) {
        const char *where = weft_jsonl_where(r);
        json_t *text = json_object_get(row, "prompt");
        WEFT_CHECK(json_is_string(text), "%s: the row has no \"prompt\" string%s", where,
                   weft_jsonl_chat_hint(row));
        char *answer = answer_of(row, where), *compact = json_dumps(row, JSON_COMPACT);
        add_prompt(set, &cap, tok, json_string_value(text), answer, weft_strdup(compact), where);
        data_source_of(row, where, set->p[set->n - 1].data_source);
        free(compact), weft_free(answer), json_decref(row);
    }
    weft_jsonl_close(r);
    WEFT_CHECK(set->n > 0, "data.source=%s holds no prompts", path);
    return set;
}

weft_rl_prompts *weft_rl_prompts_load(const weft_job_config *cfg, const weft_tokenizer *tok,
                                      bool held_out) {
    if (strcmp(cfg->data.source, "synthetic") == 0) return synthetic_prompts(cfg, tok, held_out);
    weft_rl_prompts *all = file_prompts(cfg, tok);
    int eval = cfg->rl.eval_prompts < all->n / 2 ? cfg->rl.eval_prompts : all->n / 2;
    weft_rl_prompts *set = weft_alloc(sizeof *set);
    int from = held_out ? all->n - eval : 0, to = held_out ? all->n : all->n - eval;
    set->n = to - from;
    set->p = weft_alloc(sizeof *set->p * (set->n > 0 ? set->n : 1));
    for (int i = 0; i < all->n; i++) {
        if (i >= from && i < to) set->p[i - from] = all->p[i];
        else weft_free(all->p[i].tokens), weft_free(all->p[i].text), weft_free(all->p[i].answer),
             weft_free(all->p[i].row);
    }
    weft_free(all->p), weft_free(all);
    return set;
}

void weft_rl_prompts_free(weft_rl_prompts *set) {
    if (!set) return;
    for (int i = 0; i < set->n; i++) {
        weft_rl_prompt *p = &set->p[i];
        weft_free(p->tokens), weft_free(p->text), weft_free(p->answer), weft_free(p->row);
    }
    weft_free(set->p);
    weft_free(set);
}
