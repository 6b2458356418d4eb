#include "rl/reward.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <string.h>

#include "rl/reward_command.h"

struct weft_reward {
    weft_reward_config cfg;
    pcre2_code *pattern; // exact_match
    pcre2_match_data *match;
    pcre2_match_context *limits;
    weft_reward_command *command; // command
};

// ---------------------------------------------------------------------------- the reward ----

weft_reward *weft_reward_create(const weft_reward_config *cfg) {
    weft_reward *r = weft_alloc(sizeof *r);
    r->cfg = *cfg;
    if (cfg->type == WEFT_REWARD_COMMAND) {
        r->command = weft_reward_command_start(cfg);
        return r;
    }
    int code;
    PCRE2_SIZE at;
    r->pattern = pcre2_compile((PCRE2_SPTR)cfg->pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &code,
                               &at, NULL);
    if (!r->pattern) {
        PCRE2_UCHAR why[256];
        pcre2_get_error_message(code, why, sizeof why);
        weft_fatal("reward.pattern=%s: not a valid PCRE2 pattern (%s at offset %zu)",
                   cfg->pattern, (const char *)why, (size_t)at);
    }
    r->match = pcre2_match_data_create_from_pattern(r->pattern, NULL);
    r->limits = pcre2_match_context_create(NULL);
    WEFT_CHECK(r->match && r->limits, "out of host memory creating the reward's matcher");
    pcre2_set_match_limit(r->limits, 10000000); // a backtracking pattern errs instead of hanging
    return r;
}

void weft_reward_free(weft_reward *r) {
    if (!r) return;
    weft_reward_command_stop(r->command);
    pcre2_match_data_free(r->match);
    pcre2_match_context_free(r->limits);
    pcre2_code_free(r->pattern);
    weft_free(r);
}

// exact_match's reward of one response.
static double match_reward(weft_reward *r, const weft_reward_input *in) {
    const char *prompt_name = in->name, *answer = in->answer, *response = in->response;
    WEFT_CHECK(answer, "%s: the prompt has no \"answer\" field, which reward.type=exact_match "
               "compares the extracted answer with; add one, or use reward.type=command",
               prompt_name);
    int rc = pcre2_match(r->pattern, (PCRE2_SPTR)response, strlen(response), 0, 0, r->match,
                         r->limits);
    if (rc == PCRE2_ERROR_NOMATCH) return 0.0;
    WEFT_CHECK(rc > 0, "%s: reward.pattern=%s failed on a response (PCRE2 error %d); simplify "
               "the pattern", prompt_name, r->cfg.pattern, rc);
    PCRE2_SIZE *v = pcre2_get_ovector_pointer(r->match);
    int group = rc > 1 && v[2] != PCRE2_UNSET ? 1 : 0;
    size_t len = v[2 * group + 1] - v[2 * group];
    return len == strlen(answer) && memcmp(response + v[2 * group], answer, len) == 0 ? 1.0 : 0.0;
}

// The request: the prompt's row (its fields, or prompt and answer) plus "response".
static void submit_command(weft_reward *r, const weft_reward_input *in, double *out) {
    json_t *req = in->row ? json_loads(in->row, 0, NULL) : json_pack("{s:s}", "prompt", in->prompt);
    if (!in->row && in->answer) json_object_set_new(req, "answer", json_string(in->answer));
    json_object_set_new(req, "response", json_string(in->response));
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    size_t len = strlen(text);
    char *line = weft_alloc(len + 1);
    memcpy(line, text, len), line[len] = '\n';
    free(text);
    weft_reward_command_send(r->command, line, len + 1, out, in->name);
    weft_free(line);
}

void weft_reward_submit(weft_reward *r, const weft_reward_input *in, double *out) {
    if (r->command) submit_command(r, in, out);
    else *out = match_reward(r, in);
}

void weft_reward_collect(weft_reward *r) {
    if (r->command) weft_reward_command_collect(r->command);
}

int weft_reward_pending(const weft_reward *r) {
    return r->command ? weft_reward_command_pending(r->command) : 0;
}
