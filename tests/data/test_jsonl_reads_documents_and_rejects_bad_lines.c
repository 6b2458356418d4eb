// Token JSONL files load into documents with the right tokens and loss masks (token 0 never a
// target), and every bad line ends the process with status 1 and one line naming "<path>:<line>".
#include "core/core.h"
#include "data/jsonl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define VOCAB 100

// Children end in weft_fatal with the reader's buffers still live, by design; under LeakSanitizer
// that would turn exit status 1 into 23, so the child stops tracking its own allocations.
extern void __lsan_disable(void) __attribute__((weak));

static char dir[64];
static int n_files;
static char files[40][128];

static const char *write_file(const char *name, const char *text) {
    CHECK(n_files < 40);
    char *path = files[n_files++];
    snprintf(path, sizeof files[0], "%s/%s", dir, name);
    CHECK(weft_write_file_atomic(path, text, strlen(text)));
    return path;
}

static void check_doc(const weft_document *d, int len, const int32_t *tokens, const uint8_t *mask) {
    CHECK(d->len == len);
    CHECK(memcmp(d->tokens, tokens, (size_t)len * sizeof *tokens) == 0);
    CHECK(memcmp(d->loss_mask, mask, (size_t)len) == 0);
}

static void test_good_file(void) {
    const char *path = write_file("good.jsonl", "{\"input_ids\": [5, 6, 7]}\n"
                                                "\n"
                                                "   \t\n"
                                                "{\"input_ids\": [1, 2, 3, 4], \"loss_mask\": [1, 0, 1, 1]}\r\n"
                                                "{\"input_ids\": [9]}\n"
                                                "{\"loss_mask\": [0, 1], \"input_ids\": [0, 99], \"extra\": \"x\"}");
    weft_document_set *set = weft_read_token_jsonl(path, VOCAB);
    CHECK(set->n == 4);
    check_doc(&set->docs[0], 3, (const int32_t[]){5, 6, 7}, (const uint8_t[]){0, 1, 1});
    check_doc(&set->docs[1], 4, (const int32_t[]){1, 2, 3, 4}, (const uint8_t[]){0, 0, 1, 1}); // mask[0]=1 ignored
    check_doc(&set->docs[2], 1, (const int32_t[]){9}, (const uint8_t[]){0});
    check_doc(&set->docs[3], 2, (const int32_t[]){0, 99}, (const uint8_t[]){0, 1});
    weft_document_set_free(set);
}

static void read_it(const char *path) { weft_document_set_free(weft_read_token_jsonl(path, VOCAB)); }

// Runs the reader on path in a child and checks it fails the weft way: exit status 1 and exactly
// one line of stderr, "weft: error: ...", containing `where` (path, or "path:line:") and `expect`.
static void expect_fatal(const char *path, const char *where, const char *expect) {
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], STDERR_FILENO);
        if (__lsan_disable) __lsan_disable();
        read_it(path);
        _exit(0); // returned normally: the bad input was accepted
    }
    close(pipefd[1]);
    char err[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pipefd[0], err + len, sizeof err - 1 - len)) > 0) len += (size_t)r;
    close(pipefd[0]);
    err[len] = '\0';
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);

    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 1 && strncmp(err, "weft: error: ", 13) == 0 &&
              strstr(err, where) && strstr(err, expect) && len > 0 && strchr(err, '\n') == err + len - 1;
    if (!ok) {
        fprintf(stderr, "case %s (expecting \"%s\", \"%s\"): status %d, stderr:\n%s\n", path, where, expect, status,
                err);
        exit(1);
    }
    printf("%s", err);
}

// A file whose line 3 is `bad` (after a good line and a blank one) must fail naming line 3.
static void expect_bad_line(const char *name, const char *bad, const char *expect) {
    char text[512], where[200];
    snprintf(text, sizeof text, "{\"input_ids\": [1, 2]}\n\n%s\n{\"input_ids\": [3]}\n", bad);
    const char *path = write_file(name, text);
    snprintf(where, sizeof where, "%s:3: ", path);
    expect_fatal(path, where, expect);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/weft_jsonl_XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL);

    test_good_file();

    expect_bad_line("malformed.jsonl", "{\"input_ids\": [1, 2", "not valid JSON");
    expect_bad_line("trailing.jsonl", "{\"input_ids\": [1]} {}", "not valid JSON");
    expect_bad_line("not_object.jsonl", "[1, 2, 3]", "not a JSON object");
    expect_bad_line("missing_ids.jsonl", "{\"ids\": [1, 2]}", "input_ids");
    expect_bad_line("ids_not_array.jsonl", "{\"input_ids\": 5}", "input_ids");
    expect_bad_line("float_id.jsonl", "{\"input_ids\": [1, 2.5]}", "input_ids[1] is not an integer");
    expect_bad_line("string_id.jsonl", "{\"input_ids\": [\"a\"]}", "input_ids[0] is not an integer");
    expect_bad_line("negative_id.jsonl", "{\"input_ids\": [1, -1]}", "outside the vocabulary");
    expect_bad_line("id_too_big.jsonl", "{\"input_ids\": [100]}", "outside the vocabulary [0, 100)");
    expect_bad_line("empty_ids.jsonl", "{\"input_ids\": []}", "empty");
    expect_bad_line("mask_length.jsonl", "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1, 1]}", "same length");
    expect_bad_line("mask_value.jsonl", "{\"input_ids\": [1, 2], \"loss_mask\": [0, 2]}", "loss_mask[1]");
    expect_bad_line("mask_bool.jsonl", "{\"input_ids\": [1, 2], \"loss_mask\": [false, true]}", "loss_mask[0]");
    expect_bad_line("mask_not_array.jsonl", "{\"input_ids\": [1, 2], \"loss_mask\": 1}", "loss_mask");

    const char *empty = write_file("empty.jsonl", "");
    expect_fatal(empty, empty, "no documents");
    const char *blank = write_file("blank.jsonl", "\n  \n\n");
    expect_fatal(blank, blank, "no documents");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/does_not_exist.jsonl", dir);
    expect_fatal(missing, missing, "cannot open");

    for (int i = 0; i < n_files; i++) unlink(files[i]);
    CHECK(rmdir(dir) == 0);
    printf("ok\n");
    return 0;
}
