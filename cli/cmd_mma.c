/* moeflip mma run: the matrix-instruction models on test vectors. */
#include "cli.h"
#include "mf_numerics.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: moeflip mma run --in VECTORS.jsonl --out RESULTS.jsonl\n"
    "\n"
    "Each input line is one case: {\"arch\", \"instr\", \"m\", \"n\", \"k\", \"A\": [hex, m*k row-major],\n"
    "\"B\": [hex, k*n], \"C\": [hex, m*n], ...}, bit patterns in hex; block-scaled instructions also take\n"
    "\"SA\": [hex, m*(k/block)] and \"SB\": [hex, (k/block)*n]. Each output line is the same object\n"
    "with \"D\" set to what the instruction computes. arch: Volta, Turing, Ampere, Ada, Hopper, Blackwell,\n"
    "RTX Blackwell, CDNA1, CDNA2, CDNA3, CDNA4; instr as PTX or AMD spell it (mma.m16n8k16.f32.bf16.bf16.f32,\n"
    "wgmma.m64n8k16.f32.bf16.bf16, tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue4m3, mfma_f32_32x32x8_bf16,\n"
    "...). Cases whose \"source\" names the H200\n"
    "(or \"hardware\") follow the hardware where it differs from MMA-Sim: NVIDIA products with a zero\n"
    "factor do not count for the largest exponent. VECTORS may be xz-compressed.\n";

static int read_hex_array(json_t *arr, size_t want, int bytes, uint64_t *out, const char *what, int line, mf_error *err) {
    if (!json_is_array(arr) || json_array_size(arr) != want)
        return mf_fail(err, MF_EINVAL, "line %d: \"%s\" must be an array of %zu hex strings", line, what, want);
    for (size_t i = 0; i < want; i++) {
        const char *s = json_string_value(json_array_get(arr, i));
        char *end;
        if (!s || !*s || strlen(s) > (size_t)bytes * 2) goto bad;
        out[i] = strtoull(s, &end, 16);
        if (*end) goto bad;
        continue;
    bad:
        return mf_fail(err, MF_EINVAL, "line %d: %s[%zu] is not a %d-byte hex bit pattern", line, what, i, bytes);
    }
    return MF_OK;
}

static json_t *hex_array(const uint64_t *v, size_t n, int bytes) {
    json_t *a = json_array();
    char buf[24];
    for (size_t i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "%0*llx", bytes * 2, (unsigned long long)v[i]);
        json_array_append_new(a, json_string(buf));
    }
    return a;
}

static int run_case(json_t *o, int line, mf_error *err) {
    const char *arch = json_string_value(json_object_get(o, "arch")), *instr = json_string_value(json_object_get(o, "instr"));
    if (!arch || !instr) return mf_fail(err, MF_EINVAL, "line %d: needs \"arch\" and \"instr\"", line);
    mf_mma_instr I;
    if (mf_mma_lookup(&I, arch, instr, err)) return mf_fail_wrap(err, "line %d", line);
    /* vectors measured on real hardware follow the hardware's zero rule; the
     * rest (MMA-Sim's) its convention */
    const char *src = json_string_value(json_object_get(o, "source"));
    I.zero_products_excluded = src && (strstr(src, "h200") || strstr(src, "H200") || strstr(src, "hardware"));
    static const char *dims[3] = {"m", "n", "k"};
    const int have[3] = {I.m, I.n, I.k};
    for (int d = 0; d < 3; d++) {
        json_t *v = json_object_get(o, dims[d]);
        if (v && (!json_is_integer(v) || json_integer_value(v) != have[d]))
            return mf_fail(err, MF_EINVAL, "line %d: %s = %lld, but %s has %s = %d", line, dims[d],
                           (long long)json_integer_value(v), instr, dims[d], have[d]);
    }
    const size_t na = (size_t)I.m * I.k, nb = (size_t)I.k * I.n, nc = (size_t)I.m * I.n;
    const size_t nsa = I.scaled ? (size_t)I.m * (I.k / I.block) : 0, nsb = I.scaled ? (size_t)(I.k / I.block) * I.n : 0;
    uint64_t *A = mf_xmalloc(na * 8), *B = mf_xmalloc(nb * 8), *C = mf_xmalloc(nc * 8), *D = mf_xmalloc(nc * 8);
    uint64_t *SA = mf_xmalloc((nsa ? nsa : 1) * 8), *SB = mf_xmalloc((nsb ? nsb : 1) * 8);
    int rc = read_hex_array(json_object_get(o, "A"), na, mf_fmt_bytes(I.a_fmt), A, "A", line, err);
    if (!rc) rc = read_hex_array(json_object_get(o, "B"), nb, mf_fmt_bytes(I.b_fmt), B, "B", line, err);
    if (!rc) rc = read_hex_array(json_object_get(o, "C"), nc, mf_fmt_bytes(I.c_fmt), C, "C", line, err);
    for (size_t i = 0; !rc && I.a_fmt == MF_FMT_E2M1 && i < na; i++)
        if (A[i] > 0xf) rc = mf_fail(err, MF_EINVAL, "line %d: A[%zu] is not an fp4 (e2m1) value: one hex digit", line, i);
    for (size_t i = 0; !rc && I.b_fmt == MF_FMT_E2M1 && i < nb; i++)
        if (B[i] > 0xf) rc = mf_fail(err, MF_EINVAL, "line %d: B[%zu] is not an fp4 (e2m1) value: one hex digit", line, i);
    if (!rc && I.scaled) rc = read_hex_array(json_object_get(o, "SA"), nsa, 1, SA, "SA", line, err);
    if (!rc && I.scaled) rc = read_hex_array(json_object_get(o, "SB"), nsb, 1, SB, "SB", line, err);
    json_t *blk = json_object_get(o, "block");
    if (!rc && I.scaled && blk && (!json_is_integer(blk) || json_integer_value(blk) != I.block))
        rc = mf_fail(err, MF_EINVAL, "line %d: block = %lld, but %s has block %d", line, (long long)json_integer_value(blk),
                     instr, I.block);
    if (!rc) {
        mf_mma_tile_scaled(&I, A, B, C, I.scaled ? SA : NULL, I.scaled ? SB : NULL, D);
        json_object_set_new(o, "D", hex_array(D, nc, mf_fmt_bytes(I.c_fmt)));
    }
    free(A);
    free(B);
    free(C);
    free(D);
    free(SA);
    free(SB);
    return rc;
}

int cmd_mma(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(help, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "run")) return cli_usage_error("mma", "unknown subcommand \"%s\" (run)", argv[1]);
    const char *in = NULL, *out = NULL;
    static const struct option opts[] = {{"in", required_argument, 0, 'i'}, {"out", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc - 1, argv + 1, "i:o:h", opts, NULL)) != -1) {
        if (c == 'i') in = optarg;
        else if (c == 'o') out = optarg;
        else if (c == 'h') {
            fputs(help, stdout);
            return 0;
        } else return cli_usage_error("mma", "unknown or incomplete option");
    }
    if (!in || !out) return cli_usage_error("mma", "--in and --out are required");
    mf_error err = {0};
    char *text;
    size_t len;
    if (mf_read_file(in, &text, &len, &err)) return cli_fail(&err);
    mf_atomic_file af;
    if (mf_atomic_open(&af, out, &err)) {
        free(text);
        return cli_fail(&err);
    }
    int line = 0, rc = 0;
    for (char *p = text, *nl; p < text + len && !rc; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) nl = text + len;
        line++;
        if (nl == p) continue;
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, &je);
        if (!o || !json_is_object(o)) {
            rc = mf_fail(&err, MF_EINVAL, "%s:%d: not a JSON object", in, line);
            json_decref(o);
            break;
        }
        rc = run_case(o, line, &err);
        if (rc) mf_fail_wrap(&err, "%s", in);
        if (!rc) {
            char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            rc = mf_atomic_write(&af, s, strlen(s), &err);
            if (!rc) rc = mf_atomic_write(&af, "\n", 1, &err);
            free(s);
        }
        json_decref(o);
    }
    free(text);
    if (rc) {
        mf_atomic_abort(&af);
        return cli_fail(&err);
    }
    if (mf_atomic_commit(&af, &err)) return cli_fail(&err);
    return 0;
}
