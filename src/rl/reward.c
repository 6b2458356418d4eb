#include "rl/reward.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct weft_reward {
    weft_reward_config cfg;
    pcre2_code *pattern;
    pcre2_match_data *match;
    pcre2_match_context *limits;
    pid_t pid; // the reward command, fed on to_child, answering on from_child
    pid_t group; // its process group: the command and whatever it started
    int to_child, from_child;
    char *line; // the answer being read (a 1 MiB line at most)
    size_t line_len, line_cap;
};

// ------------------------------------------------------------------------ reward command ----

static void start_command(weft_reward *r) {
    int in[2], out[2];
    WEFT_CHECK(pipe(in) == 0 && pipe(out) == 0, "reward.command: cannot create pipes (%s)",
               strerror(errno));
    // A command that dies must not kill weft on its next write: the write fails with EPIPE and
    // becomes one clear error instead.
    signal(SIGPIPE, SIG_IGN);
    fflush(NULL);
    r->pid = fork();
    WEFT_CHECK(r->pid >= 0, "reward.command: cannot start a process (%s)", strerror(errno));
    if (r->pid == 0) {
        setpgid(0, 0);
        dup2(in[0], STDIN_FILENO), dup2(out[1], STDOUT_FILENO);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execl("/bin/sh", "sh", "-c", r->cfg.command, (char *)NULL);
        _exit(127);
    }
    setpgid(r->pid, r->pid); // (here too: whichever of the two runs first)
    r->group = r->pid;
    close(in[0]), close(out[1]);
    r->to_child = in[1], r->from_child = out[0];
}

// Ends the command and everything it started (sh -c forks the program; a hung program would
// otherwise outlive weft, sleeping with its pipes).
static void kill_command(weft_reward *r) {
    if (r->group > 0) kill(-r->group, SIGKILL);
    if (r->pid > 0) waitpid(r->pid, NULL, 0);
    r->pid = r->group = 0;
}

// How the command ended, for an error message: its exit status or signal, or "still running".
static void command_state(weft_reward *r, char *buf, size_t n) {
    int status;
    pid_t done = waitpid(r->pid, &status, WNOHANG);
    if (done == r->pid && WIFEXITED(status)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (done == r->pid && WIFSIGNALED(status)) snprintf(buf, n, "was killed by signal %d", WTERMSIG(status));
    else snprintf(buf, n, "is still running");
    if (done == r->pid) r->pid = 0;
}

noreturn static void command_failed(weft_reward *r, const char *prompt, const char *what) {
    char state[64];
    usleep(100000); // a crashing command's exit status is there a moment after its pipe closes
    command_state(r, state, sizeof state);
    kill_command(r);
    weft_fatal("%s: reward.command (%s) %s; it %s. The command must answer each JSON request "
               "line on stdin with one line {\"reward\": x} within reward.timeout=%g s",
               prompt, r->cfg.command, what, state, r->cfg.timeout);
}

static void send_request(weft_reward *r, const char *prompt, const char *text) {
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t k = write(r->to_child, text + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) command_failed(r, prompt, "stopped reading requests");
        done += (size_t)k;
    }
}

// One answer line, waiting at most reward.timeout seconds in all.
static const char *read_answer(weft_reward *r, const char *prompt) {
    double deadline = weft_now_seconds() + r->cfg.timeout;
    r->line_len = 0;
    for (;;) {
        char *nl = r->line_len ? memchr(r->line, '\n', r->line_len) : NULL;
        if (nl) {
            *nl = '\0';
            return r->line;
        }
        double left = deadline - weft_now_seconds();
        struct pollfd pfd = {.fd = r->from_child, .events = POLLIN};
        int ready = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) command_failed(r, prompt, "gave no answer in time");
        if (r->line_len + 4096 > r->line_cap) {
            char *bigger = weft_alloc(r->line_cap + 8192);
            if (r->line_len) memcpy(bigger, r->line, r->line_len);
            weft_free(r->line);
            r->line = bigger, r->line_cap += 8192;
        }
        ssize_t k = read(r->from_child, r->line + r->line_len, 4095);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) command_failed(r, prompt, "closed its output without an answer");
        r->line_len += (size_t)k;
        WEFT_CHECK(r->line_len < (1u << 20), "%s: reward.command answered a line of over 1 MiB; "
                   "answer {\"reward\": x}", prompt);
    }
}

// The request: the prompt's row (its fields, or prompt and answer) plus "response".
static double command_reward(weft_reward *r, const char *prompt_name, const char *row,
                             const char *prompt, const char *answer, const char *response) {
    json_t *req = row ? json_loads(row, 0, NULL) : json_pack("{s:s}", "prompt", prompt);
    if (!row && answer) json_object_set_new(req, "answer", json_string(answer));
    json_object_set_new(req, "response", json_string(response));
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    size_t len = strlen(text);
    char *line = weft_alloc(len + 2);
    memcpy(line, text, len), line[len] = '\n', line[len + 1] = '\0';
    free(text);
    send_request(r, prompt_name, line);
    weft_free(line);
    const char *answer_line = read_answer(r, prompt_name);
    json_t *a = json_loads(answer_line, 0, NULL), *v = json_object_get(a, "reward");
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x)) {
        char shown[128];
        snprintf(shown, sizeof shown, "%s", answer_line);
        json_decref(a);
        weft_fatal("%s: reward.command (%s) answered \"%s\", not {\"reward\": x} with a finite "
                   "number x", prompt_name, r->cfg.command, shown);
    }
    json_decref(a);
    return x;
}

static void stop_command(weft_reward *r) {
    close(r->to_child), close(r->from_child);
    if (r->pid <= 0) return;
    for (int i = 0; i < 50 && waitpid(r->pid, NULL, WNOHANG) == 0; i++) usleep(20000);
    kill_command(r);
}

// ---------------------------------------------------------------------------- the reward ----

weft_reward *weft_reward_create(const weft_reward_config *cfg) {
    weft_reward *r = weft_alloc(sizeof *r);
    r->cfg = *cfg;
    if (cfg->type == WEFT_REWARD_COMMAND) {
        WEFT_CHECK(cfg->command[0], "reward.type=command needs reward.command=\"...\": a "
                   "command line that reads JSON requests on stdin");
        WEFT_CHECK(cfg->timeout > 0, "reward.timeout=%g must be positive", cfg->timeout);
        start_command(r);
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
    if (r->cfg.type == WEFT_REWARD_COMMAND) stop_command(r);
    weft_free(r->line);
    pcre2_match_data_free(r->match);
    pcre2_match_context_free(r->limits);
    pcre2_code_free(r->pattern);
    weft_free(r);
}

double weft_reward_score(weft_reward *r, const weft_reward_input *in) {
    const char *prompt_name = in->name, *answer = in->answer, *response = in->response;
    if (r->cfg.type == WEFT_REWARD_COMMAND)
        return command_reward(r, prompt_name, in->row, in->prompt, answer, response);
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
