// Token JSONL files load into documents with the right tokens and loss masks (token 0 never a
// target), and every bad line ends the process with status 1 and one line naming "<path>:<line>".
#include "../testing.h"
#include "core/core.h"
#include "data/jsonl.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define VOCAB 100

static void check_doc(const weft_document *d, int len, const int32_t *tokens, const uint8_t *mask) {
    CHECK(d->len == len);
    CHECK(memcmp(d->tokens, tokens, (size_t)len * sizeof *tokens) == 0);
    CHECK(memcmp(d->loss_mask, mask, (size_t)len) == 0);
}

static void test_good_file(void) {
    const char *path =
        weft_test_write_text("good.jsonl", "{\"input_ids\": [5, 6, 7]}\n"
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

// A UTF-8 byte-order mark before the first line is skipped, as editors on Windows write one.
static void test_byte_order_mark(void) {
    const char *path = weft_test_write_text("bom.jsonl", "\xEF\xBB\xBF{\"input_ids\": [5, 6]}\r\n"
                                                         "{\"input_ids\": [7]}\r\n");
    weft_document_set *set = weft_read_token_jsonl(path, VOCAB);
    CHECK(set->n == 2);
    check_doc(&set->docs[0], 2, (const int32_t[]){5, 6}, (const uint8_t[]){0, 1});
    check_doc(&set->docs[1], 1, (const int32_t[]){7}, (const uint8_t[]){0});
    weft_document_set_free(set);
}

static void read_it(const char *path) { weft_document_set_free(weft_read_token_jsonl(path, VOCAB)); }

// A file whose line 3 is `bad` (after a good line and a blank one) must fail naming line 3.
static void expect_bad_line(const char *name, const char *bad, const char *expect) {
    char text[512], where[200];
    snprintf(text, sizeof text, "{\"input_ids\": [1, 2]}\n\n%s\n{\"input_ids\": [3]}\n", bad);
    const char *path = weft_test_write_text(name, text);
    snprintf(where, sizeof where, "%s:3: ", path);
    EXPECT_FATAL(read_it, path, where, expect);
}

int main(void) {
    weft_test_make_dir("weft_jsonl");

    test_good_file();
    test_byte_order_mark();

    expect_bad_line("malformed.jsonl", "{\"input_ids\": [1, 2", "not valid JSON");
    expect_bad_line("trailing.jsonl", "{\"input_ids\": [1]} {}", "not valid JSON");
    expect_bad_line("not_object.jsonl", "[1, 2, 3]", "not a JSON object");
    expect_bad_line("late_bom.jsonl", "\xEF\xBB\xBF{\"input_ids\": [1]}", "not valid JSON"); // only line 1's
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

    EXPECT_FATAL(read_it, weft_test_write_text("empty.jsonl", ""), "no documents");
    EXPECT_FATAL(read_it, weft_test_write_text("blank.jsonl", "\n  \n\n"), "no documents");
    EXPECT_FATAL(read_it, weft_test_path("does_not_exist.jsonl"), "cannot open");

    weft_test_remove_dir();
    printf("ok\n");
    return 0;
}
