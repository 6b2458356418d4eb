// Data parallelism's gradient buckets, several of them (1 MiB buckets over a 2.4 MiB model, cut
// inside parameters), on 1, 2 and 3 ranks, for DDP and the distributed optimizer, reduced during a
// simulated backward or only after it:
//   - every summed element is exactly the sum of the ranks' values (small integers, so any
//     summation order gives the same bits), padding included;
//   - no bucket starts before backward has finished every parameter in it: elements not yet
//     computed hold NaN, which an early start would carry into the sum (on one rank, where the
//     reduce-scatter is a copy made at the start, that is certain);
//   - a rank without a backward in a step (no documents) still enters every bucket's collective,
//     in the same order (the collective cross-check is on);
//   - the ranks' owned elements cover the buffer once: their squared norms add up to the whole
//     one, their counts to the buffer's length;
//   - optimizer state (owned elements, in optimizer order) gathered into a whole-buffer array
//     and selected back is unchanged, and the parameter all-gather leaves every rank every rank's
//     owned values.
// ctest runs it as one process, which then runs itself under mpirun on 2 and 3 ranks.
#include "../testing.h"
#include "parallel/dp.h"

#include <math.h>

enum { STEPS = 2 };

// Rank r's gradient at element e: a small integer, so sums over ranks are exact in any order.
static float local_grad(int rank, size_t e) {
    return (float)((int)((e * 7 + (size_t)rank * 13) % 17) - 8);
}

// The summed gradient every element must end with: 0 in the padding, which no tensor writes.
static float *expected_sum(const weft_model *m, int ranks, int idle_rank) {
    float *want = weft_alloc(sizeof(float) * m->n_padded);
    for (int i = 0; i < m->n_params; i++)
        for (size_t j = 0; j < m->params[i].numel; j++)
            for (int r = 0; r < ranks; r++)
                if (r != idle_rank)
                    want[m->params[i].offset + j] += local_grad(r, m->params[i].offset + j);
    return want;
}

// Backward as the model runs it: parameters from the last to the first, each computed, then
// announced through the hook.
static void simulated_backward(weft_model *m, weft_grad_hook hook, int rank) {
    for (int i = 0; i < m->n_params; i++)
        for (size_t j = 0; j < m->params[i].numel; j++) weft_model_grad(m, i)[j] = NAN;
    for (int i = m->n_params - 1; i >= 0; i--) {
        for (size_t j = 0; j < m->params[i].numel; j++)
            weft_model_grad(m, i)[j] = local_grad(rank, m->params[i].offset + j);
        hook.ready(hook.ctx, i);
    }
}

static double allreduced(weft_comm *world, double x) {
    weft_comm_allreduce_sum(world, &x, 1, WEFT_COMM_F64);
    return x;
}

// After a step's sync: the owned elements hold the sum, they cover the buffer once, and the
// gradient all-gather completes the rest.
static void check_gradients(weft_comm *world, weft_dp *dp, const weft_optimizer *o,
                            const weft_model *m, const float *want) {
    double whole_sumsq = 0;
    for (size_t e = 0; e < m->n_padded; e++) whole_sumsq += (double)want[e] * want[e];
    for (const weft_optim_range *r = o->ranges; r < o->ranges + o->n_ranges; r++)
        for (size_t e = r->lo; e < r->hi; e++) CHECK(m->grad_buf[e] == want[e]);
    double share = 0; // the CPU backend's "device" memory is host memory
    weft_dp_owned_sumsq(dp, &share);
    double sumsq = allreduced(world, share);
    CHECK(fabs(sumsq - whole_sumsq) <= 1e-6 * whole_sumsq);
    // DDP: every rank owns every element.
    double owners = weft_dp_is_sharded(dp) ? 1 : weft_comm_size(world);
    CHECK(allreduced(world, (double)o->numel) == owners * (double)m->n_padded);
    weft_dp_gather_gradients(dp);
    for (size_t e = 0; e < m->n_padded; e++) CHECK(m->grad_buf[e] == want[e]);
}

// Optimizer state to a whole-buffer array and back, and the parameters' all-gather.
static void check_gathers(weft_comm *world, weft_dp *dp, weft_optimizer *o, weft_model *m) {
    float *params = m->param_buf, *whole = weft_alloc(sizeof(float) * m->n_padded);
    float *back = weft_alloc(sizeof(float) * o->numel);
    for (size_t e = 0; e < m->n_padded; e++) params[e] = (float)-(1 + weft_comm_rank(world));
    size_t k = 0;
    for (const weft_optim_range *r = o->ranges; r < o->ranges + o->n_ranges; r++)
        for (size_t e = r->lo; e < r->hi; e++, k++) o->m[k] = params[e] = (float)e + 0.5f;
    weft_dp_gather_owned(dp, o->m, whole);
    for (size_t e = 0; e < m->n_padded; e++) CHECK(whole[e] == (float)e + 0.5f);
    weft_dp_select_owned(dp, whole, back);
    CHECK(memcmp(back, o->m, sizeof(float) * o->numel) == 0);
    weft_dp_gather_parameters(dp);
    for (size_t e = 0; e < m->n_padded; e++) CHECK(params[e] == (float)e + 0.5f);
    weft_free(whole);
    weft_free(back);
}

static void run_case(weft_comm *world, weft_backend *be, bool sharded, bool overlap) {
    int rank = weft_comm_rank(world), ranks = weft_comm_size(world);
    weft_model_config cfg = {.vocab_size = 3000, .hidden_size = 64, .intermediate_size = 512,
                             .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 16,
                             .rope_theta = 1e4, .rms_norm_eps = 1e-6, .attention_bias = true};
    weft_model_options mo = {.pad_multiple = weft_dp_pad_multiple(world)};
    weft_model *m = weft_model_create(be, &cfg, &mo);
    weft_parallel_config pc = weft_parallel_config_default();
    pc.use_distributed_optimizer = sharded;
    pc.overlap_grad_reduce = overlap;
    pc.bucket_mb = 1;
    pc.debug_collectives = true;
    pc.collective_timeout = 120;
    weft_dp *dp = weft_dp_create(world, m, &pc);
    weft_optim_config oc = weft_optim_config_default();
    weft_optimizer *o = weft_dp_create_optimizer(dp, &oc);
    for (int step = 0; step < STEPS; step++) {
        int idle = step == 1 ? ranks - 1 : -1; // the second step's last rank had no documents
        weft_comm_op op = sharded ? WEFT_OP_REDUCE_SCATTER : WEFT_OP_ALLREDUCE;
        long calls = weft_comm_get_stats(world).calls[op];
        weft_model_zero_grad(m);
        weft_dp_arm_last_microbatch(dp);
        if (rank != idle) simulated_backward(m, weft_dp_grad_hook(dp), rank);
        weft_dp_finish_gradients(dp);
        CHECK(weft_comm_get_stats(world).calls[op] - calls >= 2); // the buckets are several
        float *want = expected_sum(m, ranks, idle);
        check_gradients(world, dp, o, m, want);
        weft_free(want);
    }
    check_gathers(world, dp, o, m);
    weft_optimizer_free(o);
    weft_dp_free(dp);
    weft_model_free(m);
}

static int run_ranks(int *argc, char ***argv) {
    weft_comm *world = weft_comm_init(argc, argv);
    weft_backend *be = weft_backend_cpu_create();
    for (int sharded = 0; sharded < 2; sharded++)
        for (int overlap = 0; overlap < 2; overlap++) run_case(world, be, sharded, overlap);
    if (weft_comm_rank(world) == 0) printf("ok: %d rank(s)\n", weft_comm_size(world));
    fflush(stdout); // before the mpirun runs print theirs
    weft_backend_destroy(be);
    weft_comm_finalize(world);
    return 0;
}

int main(int argc, char **argv) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return run_ranks(&argc, &argv); // a rank under mpirun
    run_ranks(&argc, &argv);
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("skipped the multi-rank runs: no mpirun\n");
        return 77;
    }
    for (int ranks = 2; ranks <= 3; ranks++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "mpirun --oversubscribe %s -np %d -x OMP_NUM_THREADS=1 %s",
                 geteuid() == 0 ? "--allow-run-as-root" : "", ranks, argv[0]);
        CHECK(system(cmd) == 0);
    }
    printf("PASS\n");
    return 0;
}
