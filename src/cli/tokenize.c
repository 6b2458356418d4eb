// `weft tokenize`: text on stdin to token ids on stdout, or with --decode ids back to bytes. The
// tool for checking a tokenizer against another implementation and for preparing data by hand.
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/core.h"
#include "data/tokenizer.h"

static const char *TOKENIZE_USAGE =
    "usage: weft tokenize [--tokenizer FILE.json] [--special | --decode] < input\n"
    "  encodes all of stdin and prints the token ids on one line, separated by spaces;\n"
    "  with --special, inside the special tokens the tokenizer's post_processor adds (as\n"
    "  prompts and documents are encoded: Llama 3's <|begin_of_text|> first);\n"
    "  with --decode, reads whitespace-separated ids and writes the decoded bytes.\n"
    "  Without --tokenizer: the byte-level tokenizer (ids 0..255 bytes, 256 <|endoftext|>).\n";

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) weft_fatal("out of host memory reading stdin");
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            char *b = realloc(buf, cap);
            if (!b) weft_fatal("out of host memory reading stdin (%zu bytes so far)", n);
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) {
            if (ferror(stdin)) weft_fatal("tokenize: cannot read stdin: %s", strerror(errno));
            break;
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int32_t *parse_ids(const char *s, size_t len, int *n_out) {
    size_t cap = 1024, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) weft_fatal("out of host memory");
    size_t i = 0;
    while (i < len) {
        if (isspace((unsigned char)s[i])) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && !isspace((unsigned char)s[j])) j++;
        char *end;
        errno = 0;
        long v = strtol(s + i, &end, 10);
        if (end != s + j || errno || v < INT32_MIN || v > INT32_MAX)
            weft_fatal("tokenize --decode: \"%.*s\" on stdin is not a token id (expected integers separated by "
                       "whitespace)",
                       (int)(j - i > 40 ? 40 : j - i), s + i);
        if (n == cap) {
            cap *= 2;
            int32_t *b = realloc(ids, cap * sizeof *ids);
            if (!b) weft_fatal("out of host memory");
            ids = b;
        }
        if (n >= (size_t)INT32_MAX) weft_fatal("tokenize --decode: too many ids");
        ids[n++] = (int32_t)v;
        i = j;
    }
    *n_out = (int)n;
    return ids;
}

int weft_cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    bool decode = false, special = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer")) {
            WEFT_CHECK(i + 1 < argc, "tokenize: --tokenizer needs a value");
            path = argv[++i];
        } else if (!strcmp(argv[i], "--decode")) {
            decode = true;
        } else if (!strcmp(argv[i], "--special")) {
            special = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(TOKENIZE_USAGE, stdout);
            return 0;
        } else {
            weft_fatal("tokenize: unknown argument \"%s\"; see weft tokenize --help", argv[i]);
        }
    }
    weft_tokenizer *t = path ? weft_tokenizer_load(path) : weft_tokenizer_byte_level();
    size_t len;
    char *input = read_stdin(&len);
    if (decode) {
        int n;
        int32_t *ids = parse_ids(input, len, &n);
        size_t out_len;
        char *out = weft_tokenizer_decode(t, ids, n, &out_len);
        if (fwrite(out, 1, out_len, stdout) != out_len) weft_fatal("tokenize: cannot write stdout");
        weft_free(out);
        free(ids);
    } else {
        int n;
        int32_t *ids = special ? weft_tokenizer_encode_special(t, input, len, &n)
                               : weft_tokenizer_encode(t, input, len, &n);
        for (int i = 0; i < n; i++) fprintf(stdout, i ? " %d" : "%d", ids[i]);
        fputc('\n', stdout);
        weft_free(ids);
    }
    if (fflush(stdout) != 0) weft_fatal("tokenize: cannot write stdout: %s", strerror(errno));
    free(input);
    weft_tokenizer_free(t);
    return 0;
}
