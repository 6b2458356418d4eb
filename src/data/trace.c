#include "data/trace.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int *weft_read_length_trace(const char *path, int *n) {
    FILE *f = weft_open_input(path, "the length trace");
    int cap = 1024, *v = weft_alloc(sizeof(int) * cap);
    char *line = NULL;
    size_t line_cap = 0;
    long lineno = 0;
    *n = 0;
    while (getline(&line, &line_cap, f) != -1) {
        lineno++;
        char *p = line, *end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\n' || *p == '\0' || *p == '#') continue; // blank lines and comments
        errno = 0;
        long len = strtol(p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        WEFT_CHECK(end != p && !*end && !errno && len >= 1 && len <= INT_MAX,
                   "%s:%ld: \"%.*s\" is not a document length; the trace holds one positive "
                   "integer per line", path, lineno, (int)strcspn(p, "\r\n"), p);
        if (*n == cap) {
            int *w = weft_alloc(sizeof(int) * cap * 2);
            memcpy(w, v, sizeof(int) * cap);
            weft_free(v);
            v = w, cap *= 2;
        }
        v[(*n)++] = (int)len;
    }
    free(line);
    fclose(f);
    WEFT_CHECK(*n > 0, "%s: the length trace holds no lengths", path);
    return v;
}
