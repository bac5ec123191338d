/* moeflip inspect: what a run holds. */
#include "cli.h"
#include "mf_rundir.h"

#include <getopt.h>
#include <jansson.h>
#include <string.h>

static const char *help =
    "usage: moeflip inspect RUN [--json]\n"
    "\n"
    "Describes a run directory: model, device, numerics, precision, what was recorded, sequences and\n"
    "sizes. The run is validated whole first (docs/readers.md): the manifest against itself, every shard's\n"
    "size and digest, every tensor's shape, every token and expert id. --json prints the manifest with a\n"
    "summary added.\n";

/* A manifest string for display: what mf_run_open did not require may be absent or of another type. */
static const char *str(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

int cmd_inspect(int argc, char **argv) {
    bool as_json = false;
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'j') as_json = true;
        else if (c == 'h') {
            fputs(help, stdout);
            return 0;
        } else return cli_usage_error("inspect", "unknown option %s", argv[optind - 1]);
    }
    if (optind != argc - 1) return cli_usage_error("inspect", "give exactly one run directory");
    const char *dir = argv[optind];
    mf_error err = {0};
    mf_run *r;
    if (mf_run_open(&r, dir, &err)) return cli_fail(&err);
    json_t *man = json_loads(r->manifest_text, 0, NULL);
    uint64_t bytes = 0, tokens = 0;
    for (size_t i = 0; i < r->n_shards; i++) bytes += r->shard_bytes[i];
    for (size_t i = 0; i < r->n_seqs; i++) tokens += (uint64_t)r->seqs[i].length;
    size_t expected = (size_t)json_integer_value(json_object_get(json_object_get(man, "input"), "n_sequences"));
    if (as_json) {
        json_t *sum = json_object();
        json_object_set_new(sum, "sequences", json_integer((json_int_t)r->n_seqs));
        json_object_set_new(sum, "tokens", json_integer((json_int_t)tokens));
        json_object_set_new(sum, "shards", json_integer((json_int_t)r->n_shards));
        json_object_set_new(sum, "shard_bytes", json_integer((json_int_t)bytes));
        json_object_set_new(sum, "verified", json_true());
        json_object_set_new(man, "summary", sum);
        char *s = json_dumps(man, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
    } else {
        json_t *model = json_object_get(man, "model"), *dev = json_object_get(man, "device"),
               *prec = json_object_get(man, "precision");
        printf("run        %s\n", dir);
        printf("model      %s (%s), %lld parameters, %d layers (%d MoE), %d experts, top-%d, vocab %d\n",
               r->arch, str(model, "dir"),
               (long long)json_integer_value(json_object_get(model, "parameters")), r->n_layers, r->n_moe,
               r->n_experts, r->top_k, r->vocab);
        printf("digests    config %s, weights %s\n", str(model, "config_digest"),
               str(model, "weights_digest"));
        json_t *ranks = json_object_get(dev, "ranks");   /* a run an MPI job's ranks wrote */
        printf("device     %s (%s), %lld threads, kernel %s", str(dev, "kind"), str(dev, "name"),
               (long long)json_integer_value(json_object_get(dev, "threads")), str(dev, "kernel"));
        if (json_is_integer(ranks)) printf(", %lld MPI ranks (name and threads: rank 0's)", (long long)json_integer_value(ranks));
        printf("\n");
        printf("numerics   %s\n", str(man, "numerics"));
        printf("precision  %s (activations %s, weights %s, opmath %s)\n", r->precision,
               str(prec, "activations"), str(prec, "weights"),
               str(prec, "opmath"));
        printf("record     %s\n", r->record);
        printf("sequences  %zu of %zu%s, %llu tokens\n", r->n_seqs, expected, r->complete ? " (complete)" : " (incomplete)",
               (unsigned long long)tokens);
        printf("shards     %zu, %llu bytes, digests, shapes and ids verified\n", r->n_shards, (unsigned long long)bytes);
        printf("created    %s by %s\n", str(man, "created"),
               str(man, "tool"));
    }
    json_decref(man);
    mf_run_close(r);
    return 0;
}
