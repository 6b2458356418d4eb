// model: a Hugging Face model directory's weights, one model.safetensors or shards listed by
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {tensor: file}}),
// read as one set of tensors and written the way save_pretrained writes them.
#include "model/safetensors.h"

#include "core/core.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SINGLE_FILE "model.safetensors"
#define INDEX_FILE "model.safetensors.index.json"

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = weft_alloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

// ----------------------------------------------------------------------------------- reading ----

// A shard is named by a plain file name inside the directory: an index naming "../x" or "/x"
// would make weft read files outside the model.
static bool plain_file_name(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

// The index's weight_map, checked: an object of tensor name -> shard file name, not empty.
static json_t *read_index(const char *path) {
    static const char *fix = "the index is damaged or was written by a broken tool; re-save the model "
                             "with save_pretrained or re-download it";
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    WEFT_CHECK(root, "%s: not valid JSON (%s%s%.0d); %s", path, err.text, err.line > 0 ? " at line " : "",
               err.line > 0 ? err.line : 0, fix);
    json_t *map = json_object_get(root, "weight_map");
    json_t *meta = json_object_get(root, "metadata");
    WEFT_CHECK(json_is_object(root) && json_is_object(map) && json_object_size(map) > 0,
               "%s: no \"weight_map\" object of tensor names and shard files; %s", path, fix);
    WEFT_CHECK(!meta || json_is_object(meta), "%s: \"metadata\" is not an object; %s", path, fix);
    json_t *total = meta ? json_object_get(meta, "total_size") : NULL;
    WEFT_CHECK(!total || (json_is_number(total) && json_number_value(total) >= 0),
               "%s: \"metadata.total_size\" is not a non-negative number; %s", path, fix);
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        WEFT_CHECK(json_is_string(file) && plain_file_name(json_string_value(file)),
                   "%s: \"weight_map\" maps \"%s\" to something other than a file name in the "
                   "model directory; %s", path, name, fix);
    }
    json_incref(map);
    json_decref(root);
    return map;
}

// The shard names in the order the index first mentions them, with how many tensors the index
// maps to each; every shard must exist before any is read, so that a missing one is reported as
// such rather than as missing tensors.
static int list_shards(const char *dir, json_t *map, const char ***out, int **counts) {
    const char **shards = NULL;
    int *count = NULL;
    int n = 0, cap = 0, count_cap = 0;
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        const char *f = json_string_value(file);
        int i = 0;
        while (i < n && strcmp(shards[i], f) != 0) i++;
        if (i < n) {
            count[i]++;
            continue;
        }
        shards = weft_grow(shards, n, &cap, sizeof *shards, 8);
        count = weft_grow(count, n, &count_cap, sizeof *count, 8);
        shards[n] = f, count[n++] = 1;
        char *path = join(dir, f);
        WEFT_CHECK(access(path, R_OK) == 0,
                   "%s: %s maps tensor \"%s\" to shard %s, but %s is %s; copy every shard the "
                   "index lists into the directory (or re-download the model)",
                   dir, INDEX_FILE, name, f, path, errno == ENOENT ? "missing" : "not readable");
        weft_free(path);
    }
    *out = shards, *counts = count;
    return n;
}

static const char *DISAGREE = "the index and its shards come from different saves; re-save the model with "
                              "save_pretrained or re-download every file";

// Every tensor of the shard must be one the index maps to it.
static void check_shard_tensors(const char *dir, json_t *map, const weft_safetensors *shard, const char *file) {
    for (int i = 0; i < shard->n; i++) {
        const char *name = shard->tensors[i].name;
        const char *want = json_string_value(json_object_get(map, name));
        WEFT_CHECK(want, "%s: shard %s holds tensor \"%s\", which %s does not list; %s", dir, file, name,
                   INDEX_FILE, DISAGREE);
        WEFT_CHECK(strcmp(want, file) == 0, "%s: shard %s holds tensor \"%s\", which %s maps to %s; %s",
                   dir, file, name, INDEX_FILE, want, DISAGREE);
    }
}

// Once every shard's tensors are known to be mapped to it, a shard holding fewer tensors than the
// index maps to it lacks one: named here.
static void check_shard_complete(const char *dir, json_t *map, const weft_safetensors *shard, const char *file,
                                 int want) {
    if (shard->n == want) return;
    const char *name;
    json_t *f;
    json_object_foreach(map, name, f) {
        WEFT_CHECK(strcmp(json_string_value(f), file) != 0 || weft_safetensors_find(shard, name),
                   "%s: %s maps tensor \"%s\" to shard %s, which does not hold it; %s", dir, INDEX_FILE,
                   name, file, DISAGREE);
    }
}

// Moves the shard's tensors and file into the set; the shard's shell is freed.
static void absorb(weft_safetensors *set, weft_safetensors *shard) {
    weft_st_tensor *tensors = weft_alloc(sizeof *tensors * (size_t)(set->n + shard->n));
    if (set->n) memcpy(tensors, set->tensors, sizeof *tensors * (size_t)set->n);
    for (int i = 0; i < shard->n; i++) {
        tensors[set->n + i] = shard->tensors[i];
        tensors[set->n + i].file = set->n_files;
    }
    weft_st_file *files = weft_alloc(sizeof *files * (size_t)(set->n_files + 1));
    if (set->n_files) memcpy(files, set->files, sizeof *files * (size_t)set->n_files);
    files[set->n_files] = shard->files[0];
    weft_free(set->tensors);
    weft_free(set->files);
    set->tensors = tensors, set->files = files;
    set->n += shard->n, set->n_files++;
    weft_free(shard->tensors);
    weft_free(shard->files);
    weft_free(shard->path);
    weft_free(shard);
}

static weft_safetensors *load_sharded(const char *dir, const char *index) {
    json_t *map = read_index(index);
    const char **shards;
    int *counts;
    int n = list_shards(dir, map, &shards, &counts);
    // Every shard is checked for tensors the index maps elsewhere before any for missing ones: a
    // tensor in the wrong shard is reported as that, not as absent from the right one.
    weft_safetensors **parts = weft_alloc(sizeof *parts * (size_t)n);
    for (int i = 0; i < n; i++) {
        char *path = join(dir, shards[i]);
        parts[i] = weft_safetensors_read_header(path);
        check_shard_tensors(dir, map, parts[i], shards[i]);
        weft_free(path);
    }
    weft_safetensors *set = weft_alloc(sizeof *set);
    set->path = weft_strdup(dir);
    for (int i = 0; i < n; i++) {
        check_shard_complete(dir, map, parts[i], shards[i], counts[i]);
        absorb(set, parts[i]);
    }
    weft_safetensors_map(set); // only once every shard is checked: an error leaves no mapping
    weft_free(parts);
    weft_free(shards);
    weft_free(counts);
    json_decref(map);
    return set;
}

// What the directory holds, for the error that says it has no weights weft reads: up to 8 names.
static void describe_dir(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    size_t len = (size_t)snprintf(out, cap, "it holds");
    int shown = 0, more = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (shown < 8 && len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s %s", shown ? "," : "", e->d_name);
        else more++;
        shown++;
    }
    if (d) closedir(d);
    if (shown == 0) snprintf(out, cap, "it is empty");
    else if (more && len < cap) snprintf(out + len, cap - len, " and %d more", more);
}

weft_safetensors *weft_safetensors_open_model(const char *path) {
    if (!is_dir(path)) return weft_safetensors_load(path);
    // transformers' order: the single file first, then the index.
    char *single = join(path, SINGLE_FILE), *index = join(path, INDEX_FILE);
    weft_safetensors *st = NULL;
    if (access(single, F_OK) == 0) st = weft_safetensors_load(single);
    else if (access(index, F_OK) == 0) st = load_sharded(path, index);
    weft_free(single);
    weft_free(index);
    if (st) return st;
    char what[1024];
    describe_dir(path, what, sizeof what);
    weft_fatal("%s: the model directory has no " SINGLE_FILE " and no " INDEX_FILE " (%s); weft reads "
               "Hugging Face safetensors weights: save the model with save_pretrained(dir, "
               "safe_serialization=True)", path, what);
}

// ----------------------------------------------------------------------------------- writing ----

// The shards' first tensors (starts[k]) for at most max_bytes each, greedily in the order added,
// as save_pretrained splits; returns the shard count (starts has room for count + 1).
static int plan_shards(const weft_safetensors_writer *w, size_t max_bytes, int *starts) {
    int n = 0;
    size_t in_shard = 0;
    for (int i = 0; i < weft_safetensors_writer_count(w); i++) {
        size_t b = weft_safetensors_writer_nbytes(w, i);
        if (n == 0 || (in_shard > 0 && in_shard + b > max_bytes)) starts[n++] = i, in_shard = 0;
        in_shard += b;
    }
    starts[n] = weft_safetensors_writer_count(w);
    return n;
}

static bool save_index(const weft_safetensors_writer *w, const char *dir, const int *starts, int n_shards,
                       char (*names)[64]) {
    json_t *map = json_object();
    size_t total = 0;
    for (int k = 0; k < n_shards; k++)
        for (int i = starts[k]; i < starts[k + 1]; i++) {
            total += weft_safetensors_writer_nbytes(w, i);
            json_object_set_new(map, weft_safetensors_writer_name(w, i), json_string(names[k]));
        }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    // Sorted tensor names, as transformers writes the index.
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    char *path = join(dir, INDEX_FILE);
    bool ok = text && weft_write_file_atomic(path, text, strlen(text));
    free(text);
    weft_free(path);
    return ok;
}

bool weft_safetensors_writer_save_model(weft_safetensors_writer *w, const char *dir, size_t max_shard_bytes) {
    WEFT_CHECK(max_shard_bytes > 0, "safetensors writer: the shard size must be positive");
    int count = weft_safetensors_writer_count(w);
    int *starts = weft_alloc(sizeof *starts * (size_t)(count + 2));
    int n = plan_shards(w, max_shard_bytes, starts);
    bool ok;
    if (n <= 1) {
        char *path = join(dir, SINGLE_FILE);
        ok = weft_safetensors_writer_save(w, path);
        weft_free(path);
    } else {
        char(*names)[64] = weft_alloc(sizeof *names * (size_t)n);
        ok = true;
        for (int k = 0; k < n && ok; k++) {
            snprintf(names[k], sizeof names[k], "model-%05d-of-%05d.safetensors", k + 1, n);
            char *path = join(dir, names[k]);
            ok = weft_safetensors_writer_save_range(w, starts[k], starts[k + 1], path);
            weft_free(path);
        }
        // The index last: a directory with an index has every shard it lists.
        ok = ok && save_index(w, dir, starts, n, names);
        weft_free(names);
    }
    weft_free(starts);
    return ok;
}
