/* One trace: config, prompts (validated whole), weights, then every sequence
 * forward and into the run directory. Used by `moeflip trace` and the sweep. */
#include "mf_trace.h"

#include <malloc.h>
#include <omp.h>
#include <string.h>

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
    if (!o->replay && (o->replay_layers || o->replay_weights))
        return mf_fail(err, MF_EINVAL, "--replay-layers and --replay-weights go with --replay RUN");
    /* a GPU chooses its experts on the device (runtime/gpu's route kernel): a replay there is not built */
    if (o->replay && gpu)
        return mf_fail(err, MF_EINVAL, "--replay runs on the CPU only: on %s the experts are chosen on the device, where "
                       "routing replay is not built", o->device);
    if (o->replay_layers && mf_replay_layers_parse(o->replay_layers, NULL, NULL, err)) return MF_EINVAL;
    return MF_OK;
}

/* Whether the trace fits this machine, from the checkpoint's headers and the
 * longest sequence, before anything is allocated: the weights used in place
 * (resident once touched) and converted, and a sequence's activations; the
 * address space for the mapped files too. A GPU's own memory is checked when
 * it is opened. */
static int trace_fits(const char *dir, const mf_config *cfg, const mf_precision *prec, unsigned flags, bool on_gpu,
                      int max_T, int threads, bool router_in, bool emu, mf_error *err) {
    mf_model_bytes mb;
    int rc = mf_model_measure(dir, prec->weights, flags, &mb, err);
    if (rc) return rc;
    char what[4600];
    if (on_gpu) {
        const uint64_t host = mf_forward_gpu_host_bytes(cfg, max_T);
        snprintf(what, sizeof what, "%s: a %d-token %s trace on a GPU (host side)", dir, max_T, prec->name);
        return mf_mem_check(host, 0, what, err);
    }
    /* an emu: profile keeps decoded weight blocks, up to its cache's bound */
    const uint64_t act = mf_forward_cpu_bytes(cfg, max_T, threads, router_in) + (emu ? MF_EMU_CACHE_BYTES : 0);
    const uint64_t slack = (256u << 20) + (uint64_t)threads * (72u << 20);   /* stacks, malloc arenas */
    snprintf(what, sizeof what, "%s: a %d-token %s trace (weights %.2f GiB in place + %.2f GiB converted, "
             "activations %.2f GiB)", dir, max_T, prec->name, (double)mb.in_place / (1u << 30),
             (double)mb.converted / (1u << 30), (double)act / (1u << 30));
    return mf_mem_check(mb.in_place + mb.converted + act, mb.files + mb.converted + act + slack, what, err);
}

int mf_trace(const mf_trace_opts *o, mf_error *err) {
    mf_precision prec;
    mf_numerics numerics;
    int rc = mf_trace_check(o, &prec, &numerics, err);
    if (rc) return rc;
    const int threads = o->threads > 0 ? o->threads : omp_get_num_procs();
    omp_set_num_threads(threads);
    /* A forward allocates and frees buffers of up to T x vocabulary values, layer after layer: kept in the
     * heap they are reused, where mapped afresh every page would be faulted in and zeroed again (4% of a
     * CPU trace of OLMoE-1B-7B's size went to clearing pages) */
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    char cfg_path[4096];
    mf_config cfg;
    if (!mf_is_dir(o->model_dir)) return mf_fail(err, MF_EIO, "%s: not a checkpoint directory", o->model_dir);
    if (!mf_path_join(cfg_path, sizeof cfg_path, o->model_dir, "config.json"))
        return mf_fail(err, MF_EINVAL, "%s: path too long", o->model_dir);
    if ((rc = mf_config_load(&cfg, cfg_path, err))) return rc;
    mf_record record = mf_record_default(cfg.vocab);
    if (o->record && mf_record_parse(o->record, &record))
        return mf_fail(err, MF_EINVAL, "--record takes routing, topk, logits or full");
    /* a run in the way is said before minutes of loading, not after */
    char manifest[4200];
    if (!o->resume && mf_path_join(manifest, sizeof manifest, o->out, "manifest.json") && mf_path_exists(manifest))
        return mf_fail(err, MF_EINVAL, "%s: a run is already there (use --resume to continue it, or another --out)", o->out);
    mf_prompts prompts;
    mf_generation gen;
    /* a run directory as input: its tokens, generated ones included, traced as they stand */
    const bool forced = mf_is_dir(o->input);
    if (forced && o->generate > 0)
        return mf_fail(err, MF_EINVAL, "%s: a run's tokens are traced as they stand; --generate takes a prompt file",
                       o->input);
    char tok_path[4200];   /* {"id", "text"} lines are encoded with the model's tokenizer.json */
    if (!mf_path_join(tok_path, sizeof tok_path, o->model_dir, "tokenizer.json"))
        return mf_fail(err, MF_EINVAL, "%s: path too long", o->model_dir);
    if ((rc = forced ? mf_prompts_from_run(&prompts, &gen, o->input, cfg.vocab, err)
                     : mf_prompts_load_text(&prompts, o->input, cfg.vocab, tok_path, err)))
        return rc;
    mf_model *model = NULL;
    mf_run_writer *w = NULL;
    mf_gpu *gpu = NULL;
    mf_replay_source *replay = NULL;
    const char *device = o->device ? o->device : "cpu";
    /* the run to replay is checked against the config and the prompts before the weights load */
    if (o->replay && (rc = mf_replay_open(&replay, o->replay, &cfg, &prompts, o->generate > 0, o->replay_layers,
                                          o->replay_weights, err)))
        goto done;
    if (mf_device_is_gpu(device) && record == MF_RECORD_FULL) {
        rc = mf_fail(err, MF_EUNSUPPORTED, "--record full (router inputs) is recorded on the CPU only; use --record topk "
                     "or logits on %s", device);
        goto done;
    }
    if (o->generate > 0) {
        if (mf_device_is_gpu(device)) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "--generate runs on the CPU for now (%s has no decode path yet)", device);
            goto done;
        }
        if ((rc = mf_generation_load(&gen, o->model_dir, cfg.vocab, o->generate, err))) goto done;
    }
    int max_T = 0;
    for (size_t i = 0; i < prompts.n; i++) {
        const mf_prompt *p = &prompts.seq[i];
        int longest = p->T + (o->generate > 0 ? o->generate : 0);
        for (int k = 0; k < p->n_choices; k++)   /* a choice is scored after the prompt */
            longest = p->T - p->generated + p->choices[k].n > longest ? p->T - p->generated + p->choices[k].n : longest;
        max_T = longest > max_T ? longest : max_T;
    }
    /* a GPU reads the files once, hashing them as it uploads them, and converts on the device */
    const bool on_gpu = mf_device_is_gpu(device);
    const unsigned flags = on_gpu ? MF_LOAD_DEFER_DIGEST | MF_LOAD_NO_CONVERT : MF_LOAD_POPULATE;
    if ((rc = trace_fits(o->model_dir, &cfg, &prec, flags, on_gpu, max_T, threads, record == MF_RECORD_FULL,
                         numerics.kind == MF_NUMERICS_EMU, err)))
        goto done;
    const double t_load = mf_now();
    if ((rc = mf_model_load(&model, o->model_dir, prec.weights, flags, err))) goto done;
    if (replay && (rc = mf_replay_check_weights(replay, model->ckpt->weights_digest, err))) goto done;
    if (mf_device_is_gpu(device) && (rc = mf_gpu_open(&gpu, device, model, &prec, &numerics, max_T, err))) goto done;
    mf_run_info info = {.model_dir = o->model_dir, .model = model, .prec = &prec, .device = device,
                        .numerics = numerics.name, .numerics_validation = numerics.validation, .threads = threads,
                        .record = record, .input_path = o->input,
                        .prompts = &prompts, .shard_seqs = o->shard_seqs, .device_name = gpu ? mf_gpu_describe(gpu) : NULL,
                        .generation = o->generate > 0 || (forced && gen.max_new_tokens > 0) ? &gen : NULL,
                        .replay_json = replay ? mf_replay_manifest(replay) : NULL};
    if ((rc = mf_run_create(&w, o->out, &info, o->resume, err))) goto done;
    const double load_s = mf_now() - t_load;
    mf_run_opts ro = {.prec = prec, .threads = threads, .record_router_in = record == MF_RECORD_FULL, .numerics = &numerics};
    mf_replay replayed;
    uint64_t total = 0, done_tokens = 0, computed = 0;
    for (size_t i = 0; i < prompts.n; i++) total += (uint64_t)prompts.seq[i].T;
    const uint64_t prompt_tokens = total;
    if (o->generate > 0) total += (uint64_t)o->generate * prompts.n;   /* at most */
    /* a generated sequence: the prompt's tokens, then the generated ones */
    int32_t *gen_tokens = o->generate > 0 ? mf_xmalloc((size_t)max_T * sizeof *gen_tokens) : NULL;
    uint64_t generated_tokens = 0;
    int scored = 0, answered = 0, correct = 0, unscored = 0;   /* multiple-choice items */
    mf_progress bar;
    mf_progress_begin(&bar, o->label ? o->label : "trace", total);
    const double t0 = mf_now();
    double forward_s = 0;
    for (size_t i = 0; i < prompts.n; i++) {
        const mf_prompt *p = &prompts.seq[i];
        const uint64_t seq_total = (uint64_t)p->T + (o->generate > 0 ? (uint64_t)o->generate : 0);
        if (mf_run_writer_has(w, p->id)) {
            done_tokens += seq_total;
            continue;
        }
        mf_seq_result r;
        mf_prompt traced = *p;
        if (replay) {
            if ((rc = mf_replay_sequence(replay, i, &replayed, err))) break;
            ro.replay = &replayed;
        }
        const double tf = mf_now();
        /* the choices first: a GPU's logits of the sequence itself stay in its buffer until they are written */
        if (p->n_choices) {
            if ((rc = mf_choices_score(&traced, model, &ro, gpu, err))) {
                mf_fail_wrap(err, "sequence %s", p->id);
                break;
            }
            const int pred = mf_choices_predicted(p->choices, p->n_choices);
            scored++;
            unscored += pred < 0;
            if (p->answer >= 0) answered++, correct += pred == p->answer;
        }
        if (o->generate > 0) {
            mf_generation own = gen;   /* a line may ask for fewer new tokens than --generate */
            if (p->own_max_new && p->max_new < own.max_new_tokens) own.max_new_tokens = p->max_new;
            rc = mf_generate_cpu(model, &ro, &own, p, gen_tokens, &traced.generated, &r, err);
            traced.tokens = gen_tokens;
            traced.T = p->T + traced.generated;
        } else {
            /* a GPU's logits go to the run as it hands them over (bf16 in a bf16 run), not widened to doubles */
            rc = gpu ? mf_gpu_forward(gpu, p->tokens, p->T, MF_GPU_ROUTING, &r, err)
                     : mf_forward_cpu(model, &ro, p->tokens, p->T, &r, err);
            if (!rc && gpu) r.logits_raw = mf_gpu_host_logits(gpu, &r.logits_raw_dtype);
        }
        forward_s += mf_now() - tf;
        if (rc) {
            mf_fail_wrap(err, "sequence %s", p->id);
            break;
        }
        rc = mf_run_writer_add(w, &traced, &r, err);
        mf_seq_result_free(&r);
        if (rc) break;
        done_tokens += seq_total;
        computed += (uint64_t)traced.T;
        generated_tokens += (uint64_t)traced.generated;
        mf_progress_update(&bar, done_tokens, p->id);
    }
    mf_progress_end(&bar);
    free(gen_tokens);
    if (!rc) rc = mf_run_writer_close(w, err);
    if (!rc && !o->silent) {
        const double secs = mf_now() - t0;
        mf_log("moeflip: wrote %s: %zu sequences, %llu %stokens (%llu computed in %.3f s, %.0f tokens/s; the forward "
               "passes %.3f s, %.0f tokens/s; writing the run %.3f s); model loaded in %.2f s; %s, %s on %s",
               o->out, mf_run_writer_done(w), (unsigned long long)prompt_tokens, o->generate > 0 ? "prompt " : "", (unsigned long long)computed, secs,
               secs > 0 ? (double)computed / secs : 0.0, forward_s, forward_s > 0 ? (double)computed / forward_s : 0.0,
               secs - forward_s, load_s, prec.name, numerics.name, gpu ? mf_gpu_describe(gpu) : "cpu");
        if (scored) {
            char right[96] = "";
            if (answered) snprintf(right, sizeof right, ", %d of the %d with an answer right (%.1f%%)", correct, answered, 100.0 * correct / answered);
            mf_log("moeflip: scored %d multiple-choice items%s", scored, right);
            if (unscored) mf_log("moeflip: warning: %d items have a NaN score: their prediction is null", unscored);
        }
        if (o->generate > 0)
            mf_log("moeflip: generated %llu tokens (greedy, at most %d a sequence, stopping at %d eos token%s from %s)",
                   (unsigned long long)generated_tokens, o->generate, gen.n_eos, gen.n_eos == 1 ? "" : "s",
                   gen.eos_source);
    }
done:
    mf_replay_close(replay);
    mf_run_writer_free(w);
    mf_gpu_close(gpu);
    mf_model_free(model);
    mf_prompts_free(&prompts);
    return rc;
}
