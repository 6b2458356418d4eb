#include "rl/reward.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

// A request sent and not yet answered: where its answer goes, and whose it is (for errors).
typedef struct pending_answer {
    double *out;
    const char *name;
} pending_answer;

struct weft_reward {
    weft_reward_config cfg;
    pcre2_code *pattern;
    pcre2_match_data *match;
    pcre2_match_context *limits;
    pid_t pid; // the reward command, fed on to_child (non-blocking), answering on from_child
    pid_t group; // its process group: the command and whatever it started
    int to_child, from_child;
    char *read; // what the command wrote and no answer has taken yet (a 1 MiB line at most)
    size_t read_len, read_cap;
    pending_answer *queue; // (queue_len) oldest first, from queue_head
    int queue_head, queue_len, queue_cap;
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
    // Requests are written without blocking, so that weft reads answers while the command's
    // output pipe is full and it waits for weft to read before it reads on.
    fcntl(r->to_child, F_SETFL, fcntl(r->to_child, F_GETFL) | O_NONBLOCK);
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

// The prompt whose answer the command owes first.
static const char *owed(const weft_reward *r) {
    return r->queue_len ? r->queue[r->queue_head].name : "a response";
}

noreturn static void command_failed(weft_reward *r, const char *what) {
    char state[64];
    usleep(100000); // a crashing command's exit status is there a moment after its pipe closes
    command_state(r, state, sizeof state);
    const char *prompt = owed(r);
    kill_command(r);
    weft_fatal("%s: reward.command (%s) %s; it %s. The command must answer each JSON request "
               "line on stdin with one line {\"reward\": x} within reward.timeout=%g s",
               prompt, r->cfg.command, what, state, r->cfg.timeout);
}

// The answer line `line` (NUL-terminated) to the oldest request.
static void take_answer(weft_reward *r, const char *line) {
    json_t *a = json_loads(line, 0, NULL), *v = json_object_get(a, "reward");
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || r->queue_len == 0) {
        char shown[128];
        snprintf(shown, sizeof shown, "%s", line);
        json_decref(a);
        // Ended first: it may be answering later requests, which would meet a closed pipe.
        kill_command(r);
        WEFT_CHECK(r->queue_len > 0, "reward.command (%s) answered \"%s\" with no request left "
                   "to answer: it must answer each request with exactly one line",
                   r->cfg.command, shown);
        weft_fatal("%s: reward.command (%s) answered \"%s\", not {\"reward\": x} with a finite "
                   "number x", owed(r), r->cfg.command, shown);
    }
    json_decref(a);
    *r->queue[r->queue_head].out = x;
    r->queue_head++, r->queue_len--;
    if (r->queue_len == 0) r->queue_head = 0;
}

// Whatever the command has written, waiting at most `ms` milliseconds for some; complete lines
// become answers. False when nothing came in that time.
static bool read_answers(weft_reward *r, int ms) {
    struct pollfd pfd = {.fd = r->from_child, .events = POLLIN};
    int ready = poll(&pfd, 1, ms);
    if (ready < 0 && errno == EINTR) return true; // (the caller's deadline still holds)
    if (ready <= 0) return false;
    if (r->read_len + 4096 > r->read_cap) {
        r->read_cap = r->read_cap * 2 + 8192;
        char *bigger = weft_alloc(r->read_cap);
        if (r->read_len) memcpy(bigger, r->read, r->read_len);
        weft_free(r->read);
        r->read = bigger;
    }
    ssize_t k = read(r->from_child, r->read + r->read_len, 4095);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (k <= 0) command_failed(r, "closed its output without an answer");
    r->read_len += (size_t)k;
    size_t used = 0;
    for (char *nl; (nl = memchr(r->read + used, '\n', r->read_len - used));) {
        *nl = '\0';
        take_answer(r, r->read + used);
        used = (size_t)(nl - r->read) + 1;
    }
    memmove(r->read, r->read + used, r->read_len - used);
    r->read_len -= used;
    if (r->read_len >= (1u << 20)) {
        kill_command(r);
        weft_fatal("%s: reward.command answered a line of over 1 MiB; answer {\"reward\": x}",
                   owed(r));
    }
    return true;
}

// Milliseconds left until `deadline`, for poll; the command has failed once none are.
static int left_ms(weft_reward *r, double deadline, const char *what) {
    double left = deadline - weft_now_seconds();
    if (left <= 0) command_failed(r, what);
    return (int)(left * 1000) + 1;
}

// Writes the request line, reading answers meanwhile so that a command blocked on its full output
// pipe can go on reading; each step of progress renews the deadline.
static void send_request(weft_reward *r, const char *text, size_t len) {
    double deadline = weft_now_seconds() + r->cfg.timeout;
    for (size_t done = 0; done < len;) {
        ssize_t k = write(r->to_child, text + done, len - done);
        if (k > 0) {
            done += (size_t)k, deadline = weft_now_seconds() + r->cfg.timeout;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            command_failed(r, "stopped reading requests");
        struct pollfd pfd[2] = {{.fd = r->to_child, .events = POLLOUT},
                                {.fd = r->from_child, .events = POLLIN}};
        int ready = poll(pfd, 2, left_ms(r, deadline, "stopped reading requests"));
        if (ready > 0 && (pfd[1].revents & (POLLIN | POLLHUP)) && read_answers(r, 0))
            deadline = weft_now_seconds() + r->cfg.timeout;
    }
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
    if (r->queue_head + r->queue_len == r->queue_cap) {
        if (r->queue_head > 0) { // room at the front: move the queue there
            memmove(r->queue, r->queue + r->queue_head, sizeof(pending_answer) * r->queue_len);
            r->queue_head = 0;
        } else {
            r->queue = weft_grow(r->queue, r->queue_len, &r->queue_cap, sizeof(pending_answer), 64);
        }
    }
    r->queue[r->queue_head + r->queue_len++] = (pending_answer){out, in->name};
    send_request(r, line, len + 1);
    weft_free(line);
    while (read_answers(r, 0)) {} // what is there already, without waiting
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
    weft_free(r->read), weft_free(r->queue);
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

void weft_reward_submit(weft_reward *r, const weft_reward_input *in, double *out) {
    if (r->cfg.type == WEFT_REWARD_COMMAND) submit_command(r, in, out);
    else *out = match_reward(r, in);
}

void weft_reward_collect(weft_reward *r) {
    double deadline = weft_now_seconds() + r->cfg.timeout;
    while (r->queue_len > 0) {
        int before = r->queue_len;
        read_answers(r, left_ms(r, deadline, "gave no answer in time"));
        if (r->queue_len < before) deadline = weft_now_seconds() + r->cfg.timeout;
    }
}

int weft_reward_pending(const weft_reward *r) { return r->queue_len; }
