/* One trace: config, prompts (validated whole), weights, then every sequence
 * forward and into the run directory. Used by `moeflip trace` and the sweep.
 *
 * In a job of several ranks (mpirun, srun: mf_dist.h) every rank loads the model and traces its share of the
 * sequences into shards of its own; rank 0 creates (or resumes) the run, adds the other ranks' shards to its
 * manifest as they report them, and closes the run once every rank has said it is done. */
#include "mf_trace.h"
#include "mf_dist.h"

#include <jansson.h>
#include <limits.h>
#include <malloc.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mf_trace_check(const mf_trace_opts *o, mf_precision *prec, mf_numerics *num, mf_error *err) {
    if (mf_precision_parse(prec, o->precision, err)) return MF_EINVAL;
    const char *ns = o->numerics ? o->numerics : prec->act == MF_F64 ? "fp64" : "native";
    if (mf_numerics_parse(num, ns, err)) return MF_EINVAL;
    if ((prec->act == MF_F64) != (num->kind == MF_NUMERICS_FP64))
        return mf_fail(err, MF_EINVAL, "--precision fp64 and --numerics fp64 go together (every product in double)");
    if (o->device && mf_device_check(o->device, err)) return MF_EINVAL;
    const bool gpu = o->device && mf_device_is_gpu(o->device);
    if (num->kind == MF_NUMERICS_FIXED && !gpu)
        return mf_fail(err, MF_EINVAL, "--numerics fixed is a GPU's own tensor-core chain (give --device cuda); on the "
                       "CPU the same arithmetic is emu:hopper:mma.m16n8k16.f32.bf16.bf16.f32");
    if (num->kind == MF_NUMERICS_FIXED && prec->act != MF_BF16 && prec->act != MF_F16)
        return mf_fail(err, MF_EINVAL, "--numerics fixed runs bf16 or fp16 products; %s has none", prec->name);
    if (num->kind == MF_NUMERICS_EMU && (prec->act == MF_BF16 || prec->act == MF_F16) && !mf_numerics_schedule(num, prec->act))
        return mf_fail(err, MF_EINVAL, "%s has no %s matrix instruction", num->arch, mf_dtype_name(prec->act));
    if (num->fp8_products == MF_FP8_W8A8 && gpu)
        return mf_fail(err, MF_EUNSUPPORTED, "--numerics %s: fp8=w8a8 runs on the CPU (the GPU backend takes no FP8 "
                       "checkpoints)", num->name);
    if (!o->replay && (o->replay_layers || o->replay_weights))
        return mf_fail(err, MF_EINVAL, "--replay-layers and --replay-weights go with --replay RUN");
    if (o->replay_layers && mf_replay_layers_parse(o->replay_layers, NULL, NULL, err)) return MF_EINVAL;
    return MF_OK;
}

/* Whether the trace fits this machine, from the checkpoint's headers and the
 * longest sequence, before anything is allocated: the weights used in place
 * (resident once touched; shared by the ranks of a node, through the page
 * cache) and converted, and a sequence's activations (each rank's own, so
 * counted once per rank of this node); the address space for the mapped
 * files too. A GPU's own memory is checked when it is opened. */
static int trace_fits(const char *dir, const mf_config *cfg, const mf_precision *prec, unsigned flags, bool on_gpu,
                      int max_T, int threads, bool router_in, bool emu, int node_ranks, mf_error *err) {
    mf_model_bytes mb;
    int rc = mf_model_measure(dir, prec->weights, flags, &mb, err);
    if (rc) return rc;
    char what[4600], ranks[64] = "";
    if (node_ranks > 1) snprintf(ranks, sizeof ranks, " for each of the %d ranks on this node", node_ranks);
    if (on_gpu) {
        const uint64_t host = mf_forward_gpu_host_bytes(cfg, max_T);
        snprintf(what, sizeof what, "%s: a %d-token %s trace on a GPU (host side%s)", dir, max_T, prec->name, ranks);
        return mf_mem_check(host * (uint64_t)node_ranks, 0, what, err);
    }
    /* an emu: profile keeps decoded weight blocks, up to its cache's bound */
    const uint64_t act = mf_forward_cpu_bytes(cfg, max_T, threads, router_in) + (emu ? MF_EMU_CACHE_BYTES : 0);
    const uint64_t slack = (256u << 20) + (uint64_t)threads * (72u << 20);   /* stacks, malloc arenas */
    snprintf(what, sizeof what, "%s: a %d-token %s trace (weights %.2f GiB in place + %.2f GiB converted, "
             "activations %.2f GiB%s)", dir, max_T, prec->name, (double)mb.in_place / (1u << 30),
             (double)mb.converted / (1u << 30), (double)act / (1u << 30), ranks);
    return mf_mem_check(mb.in_place + (mb.converted + act) * (uint64_t)node_ranks, mb.files + mb.converted + act + slack,
                        what, err);
}

/* What a sequence costs to trace, in token positions: the prompt, what it may generate, and each choice scored
 * after the prompt. */
static uint64_t sequence_cost(const mf_prompt *p, int generate) {
    int gen = generate;
    if (p->own_max_new && p->max_new < gen) gen = p->max_new;
    uint64_t c = (uint64_t)p->T + (uint64_t)(gen > 0 ? gen : 0);
    for (int k = 0; k < p->n_choices; k++) c += (uint64_t)(p->T - p->generated + p->choices[k].n);
    return c;
}

typedef struct cost_order {
    uint64_t cost;
    size_t index;
} cost_order;

static int cmp_cost(const void *a, const void *b) {
    const cost_order *x = a, *y = b;
    if (x->cost != y->cost) return x->cost < y->cost ? 1 : -1;   /* the most costly first */
    return (x->index > y->index) - (x->index < y->index);
}

void mf_trace_assign(const mf_prompts *p, const bool *done, int generate, int ranks, int *owner) {
    cost_order *v = mf_xcalloc(p->n + 1, sizeof *v);
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++) {
        owner[i] = -1;
        if (!done || !done[i]) v[n++] = (cost_order){sequence_cost(&p->seq[i], generate), i};
    }
    qsort(v, n, sizeof *v, cmp_cost);
    uint64_t *load = mf_xcalloc((size_t)ranks + 1, sizeof *load);
    for (size_t j = 0; j < n; j++) {
        int least = 0;
        for (int r = 1; r < ranks; r++)
            if (load[r] < load[least]) least = r;
        owner[v[j].index] = least;
        load[least] += v[j].cost;
    }
    free(load);
    free(v);
}

/* A rank's account of its part of the trace, as it tells rank 0 at the end (TAG_DONE). */
typedef struct trace_tally {
    uint64_t computed, generated;   /* tokens */
    double forward_s, decode_s;   /* decode_s: generation's steps after the prompts */
    int scored, answered, correct, unscored;
    int rc;
    long at;                        /* the prompt whose sequence failed, or the prompt count when none did */
    char msg[sizeof(((mf_error *)0)->msg)];
} trace_tally;

enum { TAG_REPORT = 1, TAG_DONE = 2 };

static char *tally_json(const trace_tally *t) {
    json_t *o = json_pack("{s:I,s:I,s:f,s:f,s:i,s:i,s:i,s:i,s:i,s:I,s:s}", "computed", (json_int_t)t->computed, "generated",
                          (json_int_t)t->generated, "forward_s", t->forward_s, "decode_s", t->decode_s, "scored", t->scored, "answered", t->answered,
                          "correct", t->correct, "unscored", t->unscored, "rc", t->rc, "at", (json_int_t)t->at, "msg", t->msg);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static int tally_parse(trace_tally *t, const char *text, size_t n) {
    json_t *o = json_loadb(text, n, 0, NULL);
    json_int_t computed = 0, generated = 0, at = 0;
    const char *msg = NULL;
    const int bad = !o || json_unpack(o, "{s:I,s:I,s:F,s:F,s:i,s:i,s:i,s:i,s:i,s:I,s:s}", "computed", &computed, "generated",
                                      &generated, "forward_s", &t->forward_s, "decode_s", &t->decode_s, "scored", &t->scored, "answered", &t->answered,
                                      "correct", &t->correct, "unscored", &t->unscored, "rc", &t->rc, "at", &at, "msg", &msg);
    if (!bad) {
        t->computed = (uint64_t)computed;
        t->generated = (uint64_t)generated;
        t->at = (long)at;
        snprintf(t->msg, sizeof t->msg, "%s", msg);
    }
    json_decref(o);
    return bad ? MF_EFORMAT : MF_OK;
}

/* Rank 0, between its own sequences (wait false) and at the end (wait true, until every rank is done): the other
 * ranks' shard reports added to the manifest, and their tallies. A report that cannot be added is a failure of
 * the trace, kept in fail (the first one only), while the rest still arrive. */
typedef struct collector {
    mf_run_writer *w;
    trace_tally *tallies;   /* [size] */
    int done;               /* ranks that reported their end */
    uint64_t positions;     /* adopted from the other ranks */
    trace_tally fail;       /* rc MF_OK until an adoption fails */
    size_t n_prompts;
} collector;

static void collect(collector *c, bool wait) {
    const int size = mf_dist_size();
    int src, tag;
    void *data;
    size_t n;
    while (c->done < size - 1 && mf_dist_recv(wait, &src, &tag, &data, &n)) {
        mf_error e = {0};
        char from[64];
        snprintf(from, sizeof from, "rank %d of %d", src, size);
        int rc = MF_OK;
        if (tag == TAG_REPORT) {
            uint64_t got = 0;
            rc = mf_run_writer_adopt(c->w, data, n, from, &got, &e);
            c->positions += got;
        } else if (tag == TAG_DONE) {
            if ((rc = tally_parse(&c->tallies[src], data, n))) mf_fail(&e, rc, "%s: its account of its sequences is malformed", from);
            c->done++;
        } else {
            rc = mf_fail(&e, MF_EFORMAT, "%s sent a message of unknown kind %d", from, tag);
        }
        free(data);
        if (rc && c->fail.rc == MF_OK) {
            c->fail.rc = rc;
            c->fail.at = (long)c->n_prompts;
            snprintf(c->fail.msg, sizeof c->fail.msg, "%s", e.msg);
        }
    }
}

int mf_trace(const mf_trace_opts *o, mf_error *err) {
    const int rank = mf_dist_rank(), size = mf_dist_size();
    mf_precision prec;
    mf_numerics numerics;
    int rc = mf_trace_check(o, &prec, &numerics, err);
    if (rc) return rc;
    /* the ranks of a node share its cores: each takes the cores its launcher bound it to (omp_get_num_procs counts
     * those), but no more than its share of the node, as a binding to a whole socket gives each rank there all
     * of the socket's cores */
    int procs = omp_get_num_procs();
    if (mf_dist_local_size() > 1) {
        const long share = sysconf(_SC_NPROCESSORS_ONLN) / mf_dist_local_size();
        if (procs > share) procs = share > 1 ? (int)share : 1;
    }
    const int threads = o->threads > 0 ? o->threads : procs;
    omp_set_num_threads(threads);
    /* A forward allocates and frees buffers of up to T x vocabulary values, layer after layer: kept in the
     * heap they are reused, where mapped afresh every page would be faulted in and zeroed again (4% of a
     * CPU trace of OLMoE-1B-7B's size went to clearing pages) */
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    char cfg_path[4096];
    mf_config cfg;
    mf_prompts prompts = {0};
    mf_generation gen = {0};
    mf_model *model = NULL;
    mf_run_writer *w = NULL;
    mf_gpu *gpu = NULL;
    mf_replay_source *replay = NULL;
    int32_t *gen_tokens = NULL;
    bool *done = NULL;
    int *owner = NULL;
    trace_tally *tallies = NULL;
    const char *device = o->device ? o->device : "cpu";
    char rank_device[64];   /* the GPU of this rank: "cuda" spread over a node's GPUs */
    const char *my_device = device;
    mf_record record = MF_RECORD_LOGITS;
    const bool forced = mf_is_dir(o->input);
    /* ---- what can be checked before loading anything, on every rank; then every rank hears how it went */
    if (!mf_is_dir(o->model_dir)) rc = mf_fail(err, MF_EIO, "%s: not a checkpoint directory", o->model_dir);
    else if (!mf_path_join(cfg_path, sizeof cfg_path, o->model_dir, "config.json"))
        rc = mf_fail(err, MF_EINVAL, "%s: path too long", o->model_dir);
    else rc = mf_config_load(&cfg, cfg_path, err);
    if (!rc && numerics.fp8_products == MF_FP8_W8A8 && cfg.fp8_block[0] <= 0)
        rc = mf_fail(err, MF_EINVAL, "%s: --numerics %s: fp8=w8a8 is for checkpoints with block-scaled FP8 weights "
                     "(quantization_config fp8, weight_block_size); this one has none", o->model_dir, numerics.name);
    if (!rc) {
        record = mf_record_default(cfg.vocab);
        if (o->record && mf_record_parse(o->record, &record))
            rc = mf_fail(err, MF_EINVAL, "--record takes routing, topk, logits or full");
    }
    /* a run in the way is said before minutes of loading, not after */
    char manifest[4200];
    if (!rc && !o->resume && mf_path_join(manifest, sizeof manifest, o->out, "manifest.json") && mf_path_exists(manifest))
        rc = mf_fail(err, MF_EINVAL, "%s: a run is already there (use --resume to continue it, or another --out)", o->out);
    /* a run directory as input: its tokens, generated ones included, traced as they stand */
    if (!rc && forced && o->generate > 0)
        rc = mf_fail(err, MF_EINVAL, "%s: a run's tokens are traced as they stand; --generate takes a prompt file", o->input);
    char tok_path[4200];   /* {"id", "text"} lines are encoded with the model's tokenizer.json */
    if (!rc && !mf_path_join(tok_path, sizeof tok_path, o->model_dir, "tokenizer.json"))
        rc = mf_fail(err, MF_EINVAL, "%s: path too long", o->model_dir);
    if (!rc)
        rc = forced ? mf_prompts_from_run(&prompts, &gen, o->input, cfg.vocab, err)
                    : mf_prompts_load_text(&prompts, o->input, cfg.vocab, tok_path, err);
    /* the run to replay is checked against the config and the prompts before the weights load */
    if (!rc && o->replay)
        rc = mf_replay_open(&replay, o->replay, &cfg, &prompts, o->generate > 0, o->replay_layers, o->replay_weights, err);
    if (!rc && mf_device_is_gpu(device) && record == MF_RECORD_FULL)
        rc = mf_fail(err, MF_EUNSUPPORTED, "--record full (router inputs) is recorded on the CPU only; use --record topk "
                     "or logits on %s", device);
    if (!rc && o->generate > 0) rc = mf_generation_load(&gen, o->model_dir, cfg.vocab, o->generate, err);
    /* a GPU named without its index: the ranks of a node take its GPUs in turn */
    if (!rc && size > 1 && mf_device_is_gpu(device) && !strchr(device, ':')) {
        int count = 0;
        if (!(rc = mf_gpu_count(device, &count, err)))
            rc = mf_device_for_rank(device, mf_dist_local_rank(), count, rank_device, sizeof rank_device, err);
        if (!rc) my_device = rank_device;
    }
    if ((rc = mf_dist_agree(rc, err))) goto done;
    int max_T = 0;
    for (size_t i = 0; i < prompts.n; i++) {
        const mf_prompt *p = &prompts.seq[i];
        int longest = p->T + (o->generate > 0 ? o->generate : 0);
        for (int k = 0; k < p->n_choices; k++)   /* a choice is scored after the prompt */
            longest = p->T - p->generated + p->choices[k].n > longest ? p->T - p->generated + p->choices[k].n : longest;
        max_T = longest > max_T ? longest : max_T;
    }
    /* ---- the model, on every rank */
    /* a GPU reads the files once, hashing them as it uploads them, and converts on the device */
    const bool on_gpu = mf_device_is_gpu(device);
    const unsigned flags = on_gpu ? MF_LOAD_DEFER_DIGEST | MF_LOAD_NO_CONVERT : MF_LOAD_POPULATE;
    const double t_load = mf_now();
    rc = trace_fits(o->model_dir, &cfg, &prec, flags, on_gpu, max_T, threads, record == MF_RECORD_FULL,
                    numerics.kind == MF_NUMERICS_EMU, mf_dist_local_size(), err);
    if (!rc) rc = mf_model_load(&model, o->model_dir, prec.weights, flags, err);
    if (!rc && replay) rc = mf_replay_check_weights(replay, model->ckpt->weights_digest, err);
    if (!rc && on_gpu)
        rc = mf_gpu_open(&gpu, my_device, model, &prec, &numerics, max_T, o->generate > 0 ? max_T : 0, err);
    if ((rc = mf_dist_agree(rc, err))) goto done;
    /* ---- the run: rank 0 creates or resumes it and says which sequences it holds and where shard numbers
     * start; the other ranks write shards into it */
    /* what an FP8 checkpoint's products were, in words (the numerics' name says it too, to a reader of names) */
    char fp8_products[400] = "";
    if (cfg.fp8_block[0] > 0 && numerics.fp8_products == MF_FP8_W8A8)
        snprintf(fp8_products, sizeof fp8_products, "w8a8: activations to e4m3 per token per 1 x %d (scale max|x| / "
                 "448 in fp32), codes times codes by %s chained over each %d of k, the block's fp32 partial times "
                 "both scales added into fp32 (DeepSeek-V3's recipe, DeepGEMM's promotion), out in %s",
                 cfg.fp8_block[1], numerics.fp8.instr.name, cfg.fp8_block[1], mf_dtype_name(prec.act));
    else if (cfg.fp8_block[0] > 0)
        snprintf(fp8_products, sizeof fp8_products, "widened: codes times block scales rounded to %s, multiplied "
                 "as any %s weight", mf_dtype_name(prec.weights), mf_dtype_name(prec.weights));
    mf_run_info info = {.model_dir = o->model_dir, .model = model, .prec = &prec, .device = device,
                        .numerics = numerics.name, .numerics_validation = numerics.validation,
                        .fp8_products = fp8_products[0] ? fp8_products : NULL, .threads = threads,
                        .record = record, .input_path = o->input,
                        .prompts = &prompts, .shard_seqs = o->shard_seqs, .device_name = gpu ? mf_gpu_describe(gpu) : NULL,
                        .generation = o->generate > 0 || (forced && gen.max_new_tokens > 0) ? &gen : NULL,
                        .replay_json = replay ? mf_replay_manifest(replay) : NULL, .ranks = size};
    /* what rank 0 tells the others: the digests of its input and weights (the ranks must read the same files), the
     * first shard number, then one byte a sequence: whether the run holds it */
    const size_t head = 2 * 33 + sizeof(int32_t), state_len = head + prompts.n;
    uint8_t *state = mf_xcalloc(state_len + 1, 1);
    if (rank == 0) {
        rc = mf_run_create(&w, o->out, &info, o->resume, err);
        const int32_t first = w ? (int32_t)mf_run_writer_next_shard(w) : 0;
        memcpy(state, prompts.digest, 33);
        memcpy(state + 33, model->ckpt->weights_digest, 33);
        memcpy(state + 66, &first, sizeof first);
        for (size_t i = 0; w && i < prompts.n; i++) state[head + i] = mf_run_writer_has(w, prompts.seq[i].id);
    }
    void *shared = state;
    size_t shared_len = state_len;
    mf_dist_bcast(&shared, &shared_len, 0);
    if (shared != state) {
        free(state);
        state = shared;
    }
    int32_t first_shard = 0;
    if (rank > 0 && shared_len >= head) {
        state[32] = state[65] = 0;
        if (shared_len != state_len || strcmp((const char *)state, prompts.digest))
            rc = mf_fail(err, MF_EMISMATCH, "%s: this rank read an input of digest %s, rank 0 one of %s: the ranks must "
                         "read the same files (a file system they share)", o->input, prompts.digest, (const char *)state);
        else if (strcmp((const char *)state + 33, model->ckpt->weights_digest))
            rc = mf_fail(err, MF_EMISMATCH, "%s: this rank loaded weights of digest %s, rank 0 weights of %s: the ranks "
                         "must read the same files (a file system they share)", o->model_dir, model->ckpt->weights_digest,
                         (const char *)state + 33);
    }
    if (shared_len == state_len) memcpy(&first_shard, state + 66, sizeof first_shard);
    if (!rc && rank > 0) rc = mf_run_part_create(&w, o->out, &info, err);
    if (w) mf_run_writer_number_shards(w, first_shard + rank, size);
    done = mf_xcalloc(prompts.n + 1, sizeof *done);
    for (size_t i = 0; i < prompts.n && shared_len == state_len; i++) done[i] = state[head + i] != 0;
    free(state);
    if ((rc = mf_dist_agree(rc, err))) goto done;
    const double load_s = mf_now() - t_load;
    /* ---- this rank's sequences */
    owner = mf_xcalloc(prompts.n + 1, sizeof *owner);
    mf_trace_assign(&prompts, done, o->generate, size, owner);
    mf_run_opts ro = {.prec = prec, .threads = threads, .record_router_in = record == MF_RECORD_FULL, .numerics = &numerics};
    mf_replay replayed;
    uint64_t total = 0, done_tokens = 0;
    for (size_t i = 0; i < prompts.n; i++) total += (uint64_t)prompts.seq[i].T;
    const uint64_t prompt_tokens = total;
    if (o->generate > 0) total += (uint64_t)o->generate * prompts.n;   /* at most */
    /* a generated sequence: the prompt's tokens, then the generated ones */
    gen_tokens = o->generate > 0 ? mf_xmalloc((size_t)max_T * sizeof *gen_tokens) : NULL;
    trace_tally mine = {.at = (long)prompts.n};
    collector col = {.w = w, .n_prompts = prompts.n};
    if (rank == 0 && size > 1) col.tallies = tallies = mf_xcalloc((size_t)size, sizeof *tallies);
    mf_progress bar;
    mf_progress_begin(&bar, o->label ? o->label : "trace", total);
    const double t0 = mf_now();
    for (size_t i = 0; i < prompts.n; i++) {
        const mf_prompt *p = &prompts.seq[i];
        const uint64_t seq_total = (uint64_t)p->T + (o->generate > 0 ? (uint64_t)o->generate : 0);
        if (done[i]) done_tokens += seq_total;
        if (owner[i] != rank) continue;
        if (rank == 0 && size > 1) collect(&col, false);
        mf_seq_result r;
        mf_prompt traced = *p;
        if (replay) {
            if ((rc = mf_replay_sequence(replay, i, &replayed, err))) {
                mine.at = (long)i;
                break;
            }
            ro.replay = &replayed;
            if (gpu) mf_gpu_set_replay(gpu, &replayed);
        }
        const double tf = mf_now();
        /* the choices first: a GPU's logits of the sequence itself stay in its buffer until they are written */
        if (p->n_choices) {
            if ((rc = mf_choices_score(&traced, model, &ro, gpu, err))) {
                mf_fail_wrap(err, "sequence %s", p->id);
                mine.at = (long)i;
                break;
            }
            const int pred = mf_choices_predicted(p->choices, p->n_choices);
            mine.scored++;
            mine.unscored += pred < 0;
            if (p->answer >= 0) mine.answered++, mine.correct += pred == p->answer;
        }
        if (o->generate > 0) {
            mf_generation own = gen;   /* a line may ask for fewer new tokens than --generate */
            if (p->own_max_new && p->max_new < own.max_new_tokens) own.max_new_tokens = p->max_new;
            double dec_s;
            rc = mf_generate(model, &ro, gpu, &own, p, gen_tokens, &traced.generated, &dec_s, &r, err);
            mine.decode_s += dec_s;
            traced.tokens = gen_tokens;
            traced.T = p->T + traced.generated;
        } else {
            /* a GPU's logits go to the run as it hands them over (bf16 in a bf16 run), not widened to doubles */
            rc = gpu ? mf_gpu_forward(gpu, p->tokens, p->T, MF_GPU_ROUTING, &r, err)
                     : mf_forward_cpu(model, &ro, p->tokens, p->T, &r, err);
            if (!rc && gpu) r.logits_raw = mf_gpu_host_logits(gpu, &r.logits_raw_dtype);
        }
        mine.forward_s += mf_now() - tf;
        if (rc) {
            mf_fail_wrap(err, "sequence %s", p->id);
            mine.at = (long)i;
            break;
        }
        rc = mf_run_writer_add(w, &traced, &r, err);
        mf_seq_result_free(&r);
        if (rc) break;
        if (rank > 0) {   /* a shard written: rank 0 adds it to the manifest */
            char *report = mf_run_writer_take_report(w);
            if (report) mf_dist_send(0, TAG_REPORT, report, strlen(report));
            free(report);
        }
        done_tokens += seq_total;
        mine.computed += (uint64_t)traced.T;
        mine.generated += (uint64_t)traced.generated;
        mf_progress_update(&bar, done_tokens + col.positions, p->id);
    }
    /* ---- the end: every rank's last shard, then rank 0 waits for every rank's account and closes the run */
    if (rank > 0) {
        if (!rc && !(rc = mf_run_writer_close(w, err))) {
            char *report = mf_run_writer_take_report(w);
            if (report) mf_dist_send(0, TAG_REPORT, report, strlen(report));
            free(report);
        }
        mine.rc = rc;
        if (rc) snprintf(mine.msg, sizeof mine.msg, "%s", err->msg);
        char *account = tally_json(&mine);
        mf_dist_send(0, TAG_DONE, account, strlen(account));
        free(account);
        mf_dist_flush();
        rc = MF_OK;   /* what happened is rank 0's to say */
    } else {
        if (size > 1) collect(&col, true);
        mf_progress_update(&bar, done_tokens + col.positions, NULL);
        /* what the other ranks finished is kept even when one of them failed */
        if (!rc) rc = mf_run_writer_close(w, err);
        /* the failure at the earliest sequence, as one process would meet it first (rank 0's own at a tie) */
        long first_at = rc ? mine.at : LONG_MAX;
        if (col.fail.rc && col.fail.at < first_at) {
            rc = mf_fail(err, col.fail.rc, "%s", col.fail.msg);
            first_at = col.fail.at;
        }
        for (int r = 1; tallies && r < size; r++)
            if (tallies[r].rc && tallies[r].at < first_at) {
                rc = mf_fail(err, tallies[r].rc, "rank %d of %d: %s", r, size, tallies[r].msg);
                first_at = tallies[r].at;
            }
        if (!rc && tallies) {
            for (int r = 1; r < size; r++) {
                mine.computed += tallies[r].computed;
                mine.generated += tallies[r].generated;
                mine.forward_s += tallies[r].forward_s;
                mine.decode_s += tallies[r].decode_s;
                mine.scored += tallies[r].scored;
                mine.answered += tallies[r].answered;
                mine.correct += tallies[r].correct;
                mine.unscored += tallies[r].unscored;
            }
        }
    }
    mf_progress_end(&bar);
    rc = mf_dist_agree(rank == 0 ? rc : MF_OK, err);
    if (!rc && rank == 0 && !o->silent) {
        const double secs = mf_now() - t0;
        if (size == 1)
            mf_log("moeflip: wrote %s: %zu sequences, %llu %stokens (%llu computed in %.3f s, %.0f tokens/s; the forward "
                   "passes %.3f s, %.0f tokens/s; writing the run %.3f s); model loaded in %.2f s; %s, %s on %s",
                   o->out, mf_run_writer_done(w), (unsigned long long)prompt_tokens, o->generate > 0 ? "prompt " : "",
                   (unsigned long long)mine.computed, secs, secs > 0 ? (double)mine.computed / secs : 0.0, mine.forward_s,
                   mine.forward_s > 0 ? (double)mine.computed / mine.forward_s : 0.0, secs - mine.forward_s, load_s,
                   prec.name, numerics.name, gpu ? mf_gpu_describe(gpu) : "cpu");
        else   /* the forward passes of the ranks overlap: their sum is CPU (or GPU) time, not wall time */
            mf_log("moeflip: wrote %s: %zu sequences, %llu %stokens (%llu computed in %.3f s by %d ranks, %.0f tokens/s; "
                   "their forward passes %.3f s summed, %.0f tokens/s a rank); model loaded in %.2f s; %s, %s on %s%s",
                   o->out, mf_run_writer_done(w), (unsigned long long)prompt_tokens, o->generate > 0 ? "prompt " : "",
                   (unsigned long long)mine.computed, secs, size, secs > 0 ? (double)mine.computed / secs : 0.0,
                   mine.forward_s, mine.forward_s > 0 ? (double)mine.computed / mine.forward_s : 0.0, load_s, prec.name,
                   numerics.name, gpu ? mf_gpu_describe(gpu) : "cpu", gpu && !strchr(device, ':') ? " and the node's other GPUs" : "");
        if (mine.scored) {
            char right[96] = "";
            if (mine.answered)
                snprintf(right, sizeof right, ", %d of the %d with an answer right (%.1f%%)", mine.correct, mine.answered,
                         100.0 * mine.correct / mine.answered);
            mf_log("moeflip: scored %d multiple-choice items%s", mine.scored, right);
            if (mine.unscored) mf_log("moeflip: warning: %d items have a NaN score: their prediction is null", mine.unscored);
        }
        if (o->generate > 0)
            mf_log("moeflip: generated %llu tokens (greedy, at most %d a sequence, stopping at %d eos token%s from %s); "
                   "decoding %.3f s, %.1f tokens/s", (unsigned long long)mine.generated, o->generate, gen.n_eos,
                   gen.n_eos == 1 ? "" : "s", gen.eos_source, mine.decode_s,
                   mine.decode_s > 0 ? (double)mine.generated / mine.decode_s : 0.0);
    }
done:
    free(gen_tokens);
    free(done);
    free(owner);
    free(tallies);
    mf_replay_close(replay);
    mf_run_writer_free(w);
    mf_gpu_close(gpu);
    mf_model_free(model);
    mf_prompts_free(&prompts);
    return rc;
}
