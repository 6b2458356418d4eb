// The data order of training (and of RL prompts): every batch comes from one epoch's shuffle, so
// no batch holds an item twice, whatever the data size and batch size; each epoch's batches are
// disjoint, its last partial batch's items wait for the next shuffle, and resuming from (epoch,
// cursor) continues the same order. A batch larger than the data is one clear error. Before,
// 64 documents in batches of 100 repeated documents inside a batch, and 70 in batches of 32
// repeated some inside the batch that crossed an epoch.
#include "../testing.h"

#include "train/job.h"

static void check_order(int n, int batch, int steps) {
    weft_data_order o, resumed;
    weft_data_order_start(&o, n, 1234, 0, 0);
    int *index = weft_alloc(sizeof(int) * batch), *again = weft_alloc(sizeof(int) * batch);
    int *seen_in_epoch = weft_alloc(sizeof(int) * n), epoch = 0;
    for (int s = 0; s < steps; s++) {
        if (s == steps / 2) weft_data_order_start(&resumed, n, 1234, o.epoch, o.cursor);
        weft_data_order_take(&o, batch, index);
        if (o.epoch != epoch) memset(seen_in_epoch, 0, sizeof(int) * n), epoch = o.epoch;
        for (int k = 0; k < batch; k++) {
            CHECK(index[k] >= 0 && index[k] < n);
            CHECK(seen_in_epoch[index[k]]++ == 0); // never twice in a batch, nor in an epoch
        }
        if (s >= steps / 2) { // the resumed order is the same order
            weft_data_order_take(&resumed, batch, again);
            CHECK(memcmp(index, again, sizeof(int) * batch) == 0);
        }
    }
    printf("n %d, batch %d: %d steps over %d epochs, no item twice in a batch\n", n, batch, steps,
           o.epoch + 1);
    weft_data_order_free(&o), weft_data_order_free(&resumed);
    weft_free(index), weft_free(again), weft_free(seen_in_epoch);
}

static void take_too_many(const char *what) {
    (void)what;
    weft_data_order o;
    weft_data_order_start(&o, 64, 1, 0, 0);
    int index[100];
    weft_data_order_take(&o, 100, index);
}

int main(void) {
    check_order(70, 32, 20);  // 6 items wait each epoch
    check_order(64, 64, 5);   // the whole data each step
    check_order(1000, 7, 500);
    check_order(5, 1, 23);
    EXPECT_FATAL(take_too_many, "batch of 100", "more than the 64 items");
    printf("ok\n");
    return 0;
}
