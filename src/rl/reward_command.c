// The reward command's processes and their pipelined requests (reward_command.h).
#include "rl/reward_command.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
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

typedef struct command_proc {
    pid_t pid;                // the command (sh -c's), fed on to_child, answering on from_child
    pid_t group;              // its process group: the command and whatever it started
    int to_child, from_child; // to_child written without blocking
    char *read; // what it wrote and no answer has taken yet (a 1 MiB line at most)
    size_t read_len, read_cap;
    pending_answer *queue; // (queue_len) oldest first, from queue_head
    int queue_head, queue_len, queue_cap;
} command_proc;

struct weft_reward_command {
    weft_reward_config cfg;
    command_proc *procs; // (n)
    int n;
};

// ------------------------------------------------------------------------------ processes ----

static void start_proc(const weft_reward_command *c, command_proc *p) {
    int in[2], out[2];
    WEFT_CHECK(pipe(in) == 0 && pipe(out) == 0, "reward.command: cannot create pipes (%s)",
               strerror(errno));
    fflush(NULL);
    p->pid = fork();
    WEFT_CHECK(p->pid >= 0, "reward.command: cannot start a process (%s)", strerror(errno));
    if (p->pid == 0) {
        setpgid(0, 0);
        dup2(in[0], STDIN_FILENO), dup2(out[1], STDOUT_FILENO);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        for (int i = 0; i < c->n; i++) // the earlier processes' pipes: theirs alone
            if (c->procs[i].pid > 0) close(c->procs[i].to_child), close(c->procs[i].from_child);
        execl("/bin/sh", "sh", "-c", c->cfg.command, (char *)NULL);
        _exit(127);
    }
    setpgid(p->pid, p->pid); // (here too: whichever of the two runs first)
    p->group = p->pid;
    close(in[0]), close(out[1]);
    p->to_child = in[1], p->from_child = out[0];
    // Requests are written without blocking, so that weft reads answers while the command's
    // output pipe is full and it waits for weft to read before it reads on.
    fcntl(p->to_child, F_SETFL, fcntl(p->to_child, F_GETFL) | O_NONBLOCK);
}

// Ends the process and everything it started (sh -c forks the program; a hung program would
// otherwise outlive weft, sleeping with its pipes).
static void kill_proc(command_proc *p) {
    if (p->group > 0) kill(-p->group, SIGKILL);
    if (p->pid > 0) waitpid(p->pid, NULL, 0);
    p->pid = p->group = 0;
}

// Before an error: every process ends first, so that none answers into a closed pipe later.
static void kill_all(weft_reward_command *c) {
    for (int i = 0; i < c->n; i++) kill_proc(&c->procs[i]);
}

// How the process ended, for an error message: its exit status or signal, or "still running".
static void proc_state(command_proc *p, char *buf, size_t n) {
    int status;
    pid_t done = waitpid(p->pid, &status, WNOHANG);
    if (done == p->pid && WIFEXITED(status)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (done == p->pid && WIFSIGNALED(status)) snprintf(buf, n, "was killed by signal %d", WTERMSIG(status));
    else snprintf(buf, n, "is still running");
    if (done == p->pid) p->pid = 0;
}

// The prompt whose answer the process owes first.
static const char *owed(const command_proc *p) {
    return p->queue_len ? p->queue[p->queue_head].name : "a response";
}

noreturn static void failed(weft_reward_command *c, command_proc *p, const char *what) {
    char state[64], which[48] = "";
    usleep(100000); // a crashing command's exit status is there a moment after its pipe closes
    proc_state(p, state, sizeof state);
    if (c->n > 1) snprintf(which, sizeof which, " (process %d of %d)", (int)(p - c->procs) + 1, c->n);
    const char *prompt = owed(p);
    kill_all(c);
    weft_fatal("%s: reward.command (%s)%s %s; it %s. The command must answer each JSON request "
               "line on stdin with one line {\"reward\": x} within reward.timeout=%g s",
               prompt, c->cfg.command, which, what, state, c->cfg.timeout);
}

// ---------------------------------------------------------------------------- answers ----

// The answer line `line` (NUL-terminated) to the process's oldest request.
static void take_answer(weft_reward_command *c, command_proc *p, const char *line) {
    json_t *a = json_loads(line, 0, NULL), *v = json_object_get(a, "reward");
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || p->queue_len == 0) {
        char shown[128];
        snprintf(shown, sizeof shown, "%s", line);
        json_decref(a);
        const char *prompt = owed(p);
        bool extra = p->queue_len == 0;
        kill_all(c);
        WEFT_CHECK(!extra, "reward.command (%s) answered \"%s\" with no request left to answer: "
                   "it must answer each request with exactly one line", c->cfg.command, shown);
        weft_fatal("%s: reward.command (%s) answered \"%s\", not {\"reward\": x} with a finite "
                   "number x", prompt, c->cfg.command, shown);
    }
    json_decref(a);
    *p->queue[p->queue_head].out = x;
    p->queue_head++, p->queue_len--;
    if (p->queue_len == 0) p->queue_head = 0;
}

// Whatever the process has written (there is some: poll said so); complete lines become answers.
static void read_answers(weft_reward_command *c, command_proc *p) {
    if (p->read_len + 4096 > p->read_cap) {
        p->read_cap = p->read_cap * 2 + 8192;
        char *bigger = weft_alloc(p->read_cap);
        if (p->read_len) memcpy(bigger, p->read, p->read_len);
        weft_free(p->read);
        p->read = bigger;
    }
    ssize_t k = read(p->from_child, p->read + p->read_len, 4095);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (k <= 0) failed(c, p, "closed its output without an answer");
    p->read_len += (size_t)k;
    size_t used = 0;
    for (char *nl; (nl = memchr(p->read + used, '\n', p->read_len - used));) {
        *nl = '\0';
        take_answer(c, p, p->read + used);
        used = (size_t)(nl - p->read) + 1;
    }
    memmove(p->read, p->read + used, p->read_len - used);
    p->read_len -= used;
    if (p->read_len >= (1u << 20)) {
        const char *prompt = owed(p);
        kill_all(c);
        weft_fatal("%s: reward.command answered a line of over 1 MiB; answer {\"reward\": x}",
                   prompt);
    }
}

// Reads the answers the process has written by now, without waiting. One that owes none is left
// alone: if it has died, the next request to it says so, naming that request's prompt.
static void read_ready(weft_reward_command *c, command_proc *p) {
    for (struct pollfd pfd = {.fd = p->from_child, .events = POLLIN};
         p->queue_len > 0 && poll(&pfd, 1, 0) > 0;)
        read_answers(c, p);
}

// Milliseconds left until `deadline`, for poll; p has failed once none are.
static int left_ms(weft_reward_command *c, command_proc *p, double deadline, const char *what) {
    double left = deadline - weft_now_seconds();
    if (left <= 0) failed(c, p, what);
    return (int)(left * 1000) + 1;
}

// ---------------------------------------------------------------------------- requests ----

// Writes the request line, reading answers meanwhile so that a process blocked on its full
// output pipe can go on reading; each step of progress renews the deadline.
static void write_request(weft_reward_command *c, command_proc *p, const char *text, size_t len) {
    double deadline = weft_now_seconds() + c->cfg.timeout;
    for (size_t done = 0; done < len;) {
        ssize_t k = write(p->to_child, text + done, len - done);
        if (k > 0) {
            done += (size_t)k, deadline = weft_now_seconds() + c->cfg.timeout;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            failed(c, p, "stopped reading requests");
        struct pollfd pfd[2] = {{.fd = p->to_child, .events = POLLOUT},
                                {.fd = p->from_child, .events = POLLIN}};
        int ready = poll(pfd, 2, left_ms(c, p, deadline, "stopped reading requests"));
        if (ready > 0 && (pfd[1].revents & (POLLIN | POLLHUP))) {
            read_answers(c, p);
            deadline = weft_now_seconds() + c->cfg.timeout;
        }
    }
}

void weft_reward_command_send(weft_reward_command *c, const char *request, size_t len,
                              double *out, const char *name) {
    command_proc *p = &c->procs[0];
    for (int i = 0; i < c->n; i++) read_ready(c, &c->procs[i]); // queues as they are now
    for (int i = 1; i < c->n; i++)
        if (c->procs[i].queue_len < p->queue_len) p = &c->procs[i];
    if (p->queue_head + p->queue_len == p->queue_cap) {
        if (p->queue_head > 0) { // room at the front: move the queue there
            memmove(p->queue, p->queue + p->queue_head, sizeof(pending_answer) * p->queue_len);
            p->queue_head = 0;
        } else {
            p->queue = weft_grow(p->queue, p->queue_len, &p->queue_cap, sizeof(pending_answer), 64);
        }
    }
    p->queue[p->queue_head + p->queue_len++] = (pending_answer){out, name};
    write_request(c, p, request, len);
}

int weft_reward_command_pending(const weft_reward_command *c) {
    int n = 0;
    for (int i = 0; i < c->n; i++) n += c->procs[i].queue_len;
    return n;
}

void weft_reward_command_collect(weft_reward_command *c) {
    double deadline = weft_now_seconds() + c->cfg.timeout;
    struct pollfd *pfd = weft_alloc(sizeof(struct pollfd) * c->n);
    int *of = weft_alloc(sizeof(int) * c->n);
    for (int before; (before = weft_reward_command_pending(c)) > 0;) {
        int n = 0;
        for (int i = 0; i < c->n; i++)
            if (c->procs[i].queue_len > 0)
                of[n] = i, pfd[n++] = (struct pollfd){.fd = c->procs[i].from_child, .events = POLLIN};
        int ready = poll(pfd, n, left_ms(c, &c->procs[of[0]], deadline, "gave no answer in time"));
        for (int k = 0; k < n && ready > 0; k++)
            if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)) read_answers(c, &c->procs[of[k]]);
        if (weft_reward_command_pending(c) < before) deadline = weft_now_seconds() + c->cfg.timeout;
    }
    weft_free(pfd), weft_free(of);
}

// ------------------------------------------------------------------------------ the set ----

weft_reward_command *weft_reward_command_start(const weft_reward_config *cfg) {
    WEFT_CHECK(cfg->command[0], "reward.type=command needs reward.command=\"...\": a command line "
               "that reads JSON requests on stdin");
    WEFT_CHECK(cfg->timeout > 0, "reward.timeout=%g must be positive", cfg->timeout);
    WEFT_CHECK(cfg->processes >= 1 && cfg->processes <= 1024, "reward.processes=%d: give 1 to "
               "1024 processes of the command per rank", cfg->processes);
    // A command that dies must not kill weft on its next write: the write fails with EPIPE and
    // becomes one clear error instead.
    signal(SIGPIPE, SIG_IGN);
    weft_reward_command *c = weft_alloc(sizeof *c);
    c->cfg = *cfg;
    c->procs = weft_alloc(sizeof(command_proc) * cfg->processes);
    for (c->n = 0; c->n < cfg->processes; c->n++) {
        c->procs[c->n] = (command_proc){0};
        start_proc(c, &c->procs[c->n]);
    }
    return c;
}

void weft_reward_command_stop(weft_reward_command *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) close(c->procs[i].to_child), close(c->procs[i].from_child);
    for (int i = 0; i < c->n; i++) {
        command_proc *p = &c->procs[i];
        for (int t = 0; t < 50 && p->pid > 0 && waitpid(p->pid, NULL, WNOHANG) == 0; t++)
            usleep(20000);
        kill_proc(p);
        weft_free(p->read), weft_free(p->queue);
    }
    weft_free(c->procs);
    weft_free(c);
}
