/* Importing the production engines' routing captures as runs (docs/commands.md, "import"):
 *
 *   vllm      CompletionOutput.routed_experts saved with numpy.save: one .npy per sequence, [rows, layers, top_k]
 *             of int16 (uint16 or int32 in versions that size the dtype by the expert count); rows = seq_len - 1
 *             (the last sampled token never ran through the model), layers = num_hidden_layers (the capturer
 *             indexes by model layer) or the MoE layers alone.
 *   sglang    meta_info["routed_experts"] of a /generate response: base64 of int32 [rows, num_hidden_layers,
 *             top_k], C order; a file holds a response object, an array or JSON lines of them, or the bare base64
 *             text. A prefill-only request has seq_len - 1 rows; prefill/decode disaggregation has returned the
 *             prompt's rows all zero (the capturer's zero-filled buffer).
 *   llamacpp  examples/moe-trace (llama.cpp PR #28544): one "layer,expert" CSV row per routed activation, in the
 *             order the eval callback sees the ffn_moe_topk-<layer> tensors: ubatch by ubatch, MoE layer by MoE
 *             layer, token by token, k ids per token. No token index is written: a ubatch's token count is its
 *             run of rows of one layer divided by k. A trace that copies the ffn_moe_topk view flat (its rows are
 *             argsort rows of n_expert ids) writes each token's whole ranking: every n_expert rows a permutation.
 *             Read as if contiguous instead, the view gives the right row count but each ubatch's argsort rows cut
 *             into k: named too (check_capture).
 *   hf        outputs.router_logits of a Hugging Face forward with output_router_logits=True, saved with
 *             safetensors: router_logits.<i> [rows, E] per MoE layer (the tuple's order) or router_logits
 *             [L, rows, E] stacked, optionally logits [rows, V]; the experts are derived from the scores with the
 *             model's routing rule (canonical top-k of the raw logits, as the CroVA import does).
 *
 * Captures map to the --tokens file's sequences in order: the i-th capture (files in the order given, captures
 * within a file in order) is the i-th line. Row r of a capture is position r of its sequence; a capture of T - 1
 * rows covers the first T - 1 tokens and the run holds those (trace the reference with --input on the imported
 * run to compare on exactly them).
 *
 * Every capture is someone else's file: it is read whole and checked against the model before anything is
 * written, and the run is built under a temporary name and renamed into place. */
#include "mf_rundir.h"
#include "rundir_int.h"
#include "mf_router.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mf_engine_parse(const char *s, mf_engine *out) {
    static const char *names[] = {"vllm", "sglang", "llamacpp", "hf"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = (mf_engine)i;
            return MF_OK;
        }
    return MF_EINVAL;
}

const char *mf_engine_name(mf_engine e) {
    static const char *names[] = {"vllm", "sglang", "llamacpp", "hf"};
    return (unsigned)e < 4 ? names[e] : "?";
}

/* One sequence's capture as read: ids [rows][layers][K] in the file's layer indexing (the model's layers, or
 * its MoE layers), or (hf) router scores [n_moe][rows][E] and optionally logits [rows][V]. */
typedef struct capture {
    char where[300];   /* "FILE" or "FILE: response 2" for messages */
    int rows, layers;
    int32_t *ids;   /* [rows][layers][file_k] */
    double *router, *logits;
    mf_dtype router_dtype, logits_dtype;
    int file_k;   /* the expert ids per row the file holds (checked against top_k) */
    int flat_line;   /* llamacpp: every n_expert rows of every layer are a permutation of the experts (the CSV's
                        first row's line), else 0: the flat copy of the ffn_moe_topk view, if the rows are too many */
    int view_line, view_t0, view_t1;   /* llamacpp: the first ubatch (its first line, tokens [t0, t1)) whose layers'
                                          ids read in order are argsort rows cut into k (see read_llamacpp), else 0 */
} capture;

/* Model layer index of each MoE layer. */
static void moe_layer_table(const mf_config *cfg, int *layer_of_moe) {
    for (int l = 0, m = 0; l < cfg->n_layers; l++)
        if (cfg->layer_is_moe[l]) layer_of_moe[m++] = l;
}

typedef struct captures {
    capture *v;
    size_t n, cap;
} captures;

static capture *new_capture(captures *cs, const char *path, int index_in_file) {
    if (cs->n == cs->cap) cs->v = mf_xrealloc(cs->v, (cs->cap = cs->cap ? 2 * cs->cap : 8) * sizeof *cs->v);
    capture *c = &cs->v[cs->n++];
    memset(c, 0, sizeof *c);
    if (index_in_file >= 0) snprintf(c->where, sizeof c->where, "%.250s: response %d", path, index_in_file + 1);
    else snprintf(c->where, sizeof c->where, "%.280s", path);
    return c;
}

static void captures_free(captures *cs) {
    for (size_t i = 0; i < cs->n; i++) {
        free(cs->v[i].ids);
        free(cs->v[i].router);
        free(cs->v[i].logits);
    }
    free(cs->v);
}

/* ---- vLLM: .npy ------------------------------------------------------------ */

/* The value of key in a .npy header dict ("{'descr': '<i2', 'fortran_order': False, 'shape': (3, 2, 4), }"):
 * a pointer just past "'key':" and its spaces, or NULL. */
static const char *npy_key(const char *h, const char *key) {
    char k[32];
    snprintf(k, sizeof k, "'%s':", key);
    const char *p = strstr(h, k);
    if (!p) return NULL;
    p += strlen(k);
    while (*p == ' ') p++;
    return p;
}

int mf_engine_read_npy(const uint8_t *d, size_t n, const char *path, int32_t **ids_out, int64_t shape[3], mf_error *err) {
    *ids_out = NULL;
    /* numpy's format (numpy/lib/format.py): magic, major and minor version, a little-endian header length (2
     * bytes in version 1, 4 in 2 and 3), the header (a Python dict literal, padded with spaces, ending in '\n'),
     * then the array's bytes */
    if (n < 10 || memcmp(d, "\x93NUMPY", 6) != 0) return mf_fail(err, MF_EFORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", path);
    const int major = d[6];
    if (major < 1 || major > 3) return mf_fail(err, MF_EFORMAT, "%s: .npy format version %d (1 to 3 are read)", path, major);
    size_t hl, off;
    if (major == 1) {
        hl = (size_t)d[8] | (size_t)d[9] << 8;
        off = 10;
    } else {
        if (n < 12) return mf_fail(err, MF_EFORMAT, "%s: truncated .npy header", path);
        hl = (size_t)d[8] | (size_t)d[9] << 8 | (size_t)d[10] << 16 | (size_t)d[11] << 24;
        off = 12;
    }
    if (hl > n - off || hl > 65536) return mf_fail(err, MF_EFORMAT, "%s: the .npy header runs past the file", path);
    char *h = mf_xmalloc(hl + 1);
    memcpy(h, d + off, hl);
    h[hl] = 0;
    int rc = MF_OK;
    const char *descr = npy_key(h, "descr"), *fo = npy_key(h, "fortran_order"), *sh = npy_key(h, "shape");
    int size = 0;
    bool is_signed = true;
    if (strlen(h) != hl || !descr || !fo || !sh || *descr != '\'') {
        rc = mf_fail(err, MF_EFORMAT, "%s: the .npy header is not a dict with descr, fortran_order and shape", path);
        goto done;
    }
    static const struct { const char *d; int size; bool sig; } types[] = {
        {"'<i2'", 2, true}, {"'<u2'", 2, false}, {"'<i4'", 4, true}, {"'<u4'", 4, false}, {"'<i8'", 8, true},
        {"'|i1'", 1, true}, {"'|u1'", 1, false},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0] && !size; i++)
        if (!strncmp(descr, types[i].d, strlen(types[i].d))) {
            size = types[i].size;
            is_signed = types[i].sig;
        }
    if (!size) {
        const char *q = strchr(descr + 1, '\'');
        rc = mf_fail(err, MF_EFORMAT, "%s: routed_experts of dtype %.*s (an expert id array is little-endian int16, uint16, int32, "
                     "uint32, int64 or 8-bit)", path, q ? (int)(q - descr + 1) : 8, descr);
        goto done;
    }
    if (strncmp(fo, "False", 5) != 0) {
        rc = mf_fail(err, MF_EFORMAT, "%s: a Fortran-order array (numpy.save of a C-order array is expected)", path);
        goto done;
    }
    if (*sh != '(') {
        rc = mf_fail(err, MF_EFORMAT, "%s: the .npy shape is not a tuple", path);
        goto done;
    }
    int nd = 0;
    const char *p = sh + 1;
    for (;;) {
        while (*p == ' ') p++;
        if (*p == ')') break;
        if (*p < '0' || *p > '9' || nd == 3) {
            rc = mf_fail(err, MF_EFORMAT, "%s: routed_experts must have 3 dimensions [tokens, layers, top_k]", path);
            goto done;
        }
        int64_t v = 0;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > (int64_t)1 << 40) {
                rc = mf_fail(err, MF_EFORMAT, "%s: a .npy dimension too large", path);
                goto done;
            }
        }
        shape[nd++] = v;
        while (*p == ' ') p++;
        if (*p == ',') p++;
    }
    if (nd != 3) {
        rc = mf_fail(err, MF_EFORMAT, "%s: routed_experts has %d dimensions; it must have 3 [tokens, layers, top_k]", path, nd);
        goto done;
    }
    const uint64_t count = (uint64_t)shape[0] * (uint64_t)shape[1] * (uint64_t)shape[2];
    if (count > ((uint64_t)1 << 36) || count * (uint64_t)size != n - off - hl) {
        rc = mf_fail(err, MF_EFORMAT, "%s: %zu bytes of data for a [%lld, %lld, %lld] array of %d-byte ids", path, n - off - hl,
                     (long long)shape[0], (long long)shape[1], (long long)shape[2], size);
        goto done;
    }
    /* held as int32 (expert indices are far below 2^31): half the memory of a large capture; a value that does not
     * fit is no expert index and is refused here, where it is still known */
    int32_t *ids = mf_xmalloc(sizeof(int32_t) * (size_t)(count ? count : 1));
    const uint8_t *b = d + off + hl;
    for (uint64_t i = 0; i < count; i++, b += size) {
        uint64_t u = 0;
        for (int j = 0; j < size; j++) u |= (uint64_t)b[j] << (8 * j);
        if (is_signed && size < 8 && (u >> (8 * size - 1))) u |= ~(uint64_t)0 << (8 * size);   /* sign-extend */
        const int64_t v = is_signed ? (int64_t)u : (u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u);
        if (v < INT32_MIN || v > INT32_MAX) {
            const uint64_t per_row = (uint64_t)shape[1] * (uint64_t)shape[2];
            free(ids);
            rc = mf_fail(err, MF_EFORMAT, "%s: row %llu, layer %llu, slot %llu: expert %lld is no expert index", path,
                         (unsigned long long)(i / per_row), (unsigned long long)(i % per_row / (uint64_t)shape[2]),
                         (unsigned long long)(i % (uint64_t)shape[2]), (long long)v);
            goto done;
        }
        ids[i] = (int32_t)v;
    }
    *ids_out = ids;
done:
    free(h);
    return rc;
}

static int read_vllm(captures *cs, const char *path, const uint8_t *d, size_t n, mf_error *err) {
    int64_t shape[3];
    int32_t *ids;
    int rc = mf_engine_read_npy(d, n, path, &ids, shape, err);
    if (rc) return rc;
    capture *c = new_capture(cs, path, -1);
    c->ids = ids;
    if (shape[0] > MF_MAX_SEQ_TOKENS || shape[1] > MF_MAX_LAYERS) {
        return mf_fail(err, MF_EFORMAT, "%s: routed_experts is [%lld, %lld, %lld]: more rows or layers than a sequence has", path,
                       (long long)shape[0], (long long)shape[1], (long long)shape[2]);
    }
    c->rows = (int)shape[0];
    c->layers = (int)shape[1];
    /* the third dimension is checked against top_k with the model (check_capture) */
    if (shape[2] < 0 || shape[2] > MF_MAX_TOP_K)
        return mf_fail(err, MF_EFORMAT, "%s: routed_experts has %lld ids per row", path, (long long)shape[2]);
    c->file_k = (int)shape[2];
    return MF_OK;
}

/* ---- SGLang: base64 int32 -------------------------------------------------- */

static int b64_value(int ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

int mf_base64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len, const char *where, mf_error *err) {
    *out = NULL;
    /* the standard alphabet with '=' padding (Python's base64.b64encode, pybase64 likewise): n a multiple of 4 */
    if (n % 4) return mf_fail(err, MF_EFORMAT, "%s: routed_experts is not base64 (%zu characters, not a multiple of 4)", where, n);
    size_t pad = n >= 1 && s[n - 1] == '=' ? (n >= 2 && s[n - 2] == '=' ? 2 : 1) : 0;
    uint8_t *b = mf_xmalloc(n / 4 * 3 + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            const bool padded = i + (size_t)j >= n - pad;
            v[j] = padded ? 0 : b64_value((unsigned char)s[i + (size_t)j]);
            if (v[j] < 0) {
                free(b);
                return mf_fail(err, MF_EFORMAT, "%s: routed_experts is not base64 (character %zu is 0x%02x)", where, i + (size_t)j,
                               (unsigned char)s[i + (size_t)j]);
            }
        }
        const uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        b[m++] = (uint8_t)(w >> 16);
        b[m++] = (uint8_t)(w >> 8);
        b[m++] = (uint8_t)w;
    }
    m -= pad;
    *out = b;
    *out_len = m;
    return MF_OK;
}

/* One response's routed_experts (base64 text): rows of layers x K int32; the layer count is the model's layers
 * when that divides the data, else its MoE layers. */
static int sglang_payload(captures *cs, const char *path, int index, const char *text, size_t len, const mf_config *cfg,
                          mf_error *err) {
    capture *c = new_capture(cs, path, index);
    uint8_t *b;
    size_t n;
    int rc = mf_base64_decode(text, len, &b, &n, c->where, err);
    if (rc) return rc;
    const size_t K = (size_t)cfg->top_k, per_all = 4 * K * (size_t)cfg->n_layers, per_moe = 4 * K * (size_t)cfg->n_moe_layers;
    size_t per = n % per_all == 0 ? per_all : per_moe && n % per_moe == 0 ? per_moe : 0;
    if (!per || n / per > MF_MAX_SEQ_TOKENS) {
        free(b);
        return mf_fail(err, MF_EFORMAT,
                       "%s: routed_experts holds %zu bytes: not whole rows of int32 [num_hidden_layers %d, top_k %zu] (nor of the "
                       "%d MoE layers)", c->where, n, cfg->n_layers, K, cfg->n_moe_layers);
    }
    c->rows = (int)(n / per);
    c->layers = per == per_all ? cfg->n_layers : cfg->n_moe_layers;
    c->ids = mf_xmalloc(sizeof(int32_t) * (n / 4 + 1));
    for (size_t i = 0; i < n / 4; i++) {
        int32_t v;
        memcpy(&v, b + 4 * i, 4);   /* little-endian hosts only (the build checks) */
        c->ids[i] = v;
    }
    c->file_k = (int)K;
    free(b);
    return MF_OK;
}

static int sglang_value(captures *cs, const char *path, int index, json_t *v, const mf_config *cfg, mf_error *err) {
    json_t *re = json_is_string(v) ? v : NULL;
    if (!re && json_is_object(v)) {
        re = json_object_get(json_object_get(v, "meta_info"), "routed_experts");
        if (!re) re = json_object_get(v, "routed_experts");
    }
    if (!json_is_string(re))
        return mf_fail(err, MF_EFORMAT, "%s: response %d has no meta_info.routed_experts string (was the request made with "
                       "return_routed_experts and the server with --enable-return-routed-experts?)", path, index + 1);
    return sglang_payload(cs, path, index, json_string_value(re), json_string_length(re), cfg, err);
}

static int read_sglang(captures *cs, const char *path, const char *text, size_t n, const mf_config *cfg, mf_error *err) {
    size_t a = 0, z = n;
    while (a < z && (text[a] == ' ' || text[a] == '\n' || text[a] == '\r' || text[a] == '\t')) a++;
    while (z > a && (text[z - 1] == ' ' || text[z - 1] == '\n' || text[z - 1] == '\r' || text[z - 1] == '\t')) z--;
    if (a == z) return mf_fail(err, MF_EFORMAT, "%s: empty", path);
    if (text[a] != '{' && text[a] != '[' && text[a] != '"') return sglang_payload(cs, path, -1, text + a, z - a, cfg, err);
    json_error_t je;
    json_t *root = json_loadb(text + a, z - a, JSON_REJECT_DUPLICATES, &je);
    int rc = MF_OK;
    if (root) {
        if (json_is_array(root)) {
            size_t i;
            json_t *v;
            json_array_foreach(root, i, v) if (!rc) rc = sglang_value(cs, path, (int)i, v, cfg, err);
            if (!json_array_size(root)) rc = mf_fail(err, MF_EFORMAT, "%s: an empty array of responses", path);
        } else rc = sglang_value(cs, path, 0, root, cfg, err);
        json_decref(root);
        return rc;
    }
    /* JSON lines: one response object a line */
    int idx = 0, line = 1;
    for (size_t p = a; p < z && !rc; line++) {
        size_t e = p;
        while (e < z && text[e] != '\n') e++;
        size_t q = p;
        while (q < e && (text[q] == ' ' || text[q] == '\r' || text[q] == '\t')) q++;
        if (q < e) {
            json_t *v = json_loadb(text + q, e - q, JSON_REJECT_DUPLICATES, &je);
            if (!v) rc = mf_fail(err, MF_EFORMAT, "%s:%d: not JSON: %s", path, line, je.text);
            else {
                rc = sglang_value(cs, path, idx++, v, cfg, err);
                json_decref(v);
            }
        }
        p = e + 1;
    }
    return rc;
}

/* ---- llama.cpp moe-trace: layer,expert CSV ----------------------------------- */

static bool parse_int(const char **p, long long *v) {
    const char *s = *p;
    bool neg = *s == '-';
    if (neg) s++;
    if (*s < '0' || *s > '9') return false;
    long long x = 0;
    while (*s >= '0' && *s <= '9') {
        x = x * 10 + (*s++ - '0');
        if (x > INT32_MAX) return false;
    }
    *v = neg ? -x : x;
    *p = s;
    return true;
}

/* Whether every run of E ids of x[0, n) (the last one may be shorter) holds no id twice: a whole run of E is then a
 * permutation of the experts [0, E). */
static bool distinct_in_blocks(const int32_t *x, size_t n, int E) {
    for (size_t g = 0; g < n; g += (size_t)E) {
        uint64_t seen[(MF_MAX_EXPERTS + 63) / 64] = {0};
        for (size_t q = g; q < n && q < g + (size_t)E; q++) {
            if (seen[x[q] / 64] >> (x[q] % 64) & 1) return false;
            seen[x[q] / 64] |= (uint64_t)1 << (x[q] % 64);
        }
    }
    return true;
}

static int read_llamacpp(captures *cs, const char *path, const char *text, size_t n, const mf_config *cfg, mf_error *err) {
    const int K = cfg->top_k, E = cfg->n_experts, L = cfg->n_moe_layers;
    if (L < 1) return mf_fail(err, MF_EINVAL, "%s: the model has no MoE layers", path);
    int moe_index[MF_MAX_LAYERS], layer_of_moe[MF_MAX_LAYERS];
    moe_layer_table(cfg, layer_of_moe);
    for (int l = 0, m = 0; l < cfg->n_layers; l++) moe_index[l] = cfg->layer_is_moe[l] ? m++ : -1;
    /* rows: (layer, expert, line) */
    size_t cap = 1024, nr = 0;
    int32_t *lay = mf_xmalloc(cap * sizeof *lay), *exp = mf_xmalloc(cap * sizeof *exp), *lno = mf_xmalloc(cap * sizeof *lno);
    int rc = MF_OK, line = 0;
    for (size_t p = 0; p < n && !rc;) {
        size_t e = p;
        while (e < n && text[e] != '\n') e++;
        line++;
        size_t z = e;
        if (z > p && text[z - 1] == '\r') z--;
        char buf[64];
        const size_t len = z - p;
        if (len == 0) {   /* a blank line: only at the end */
            p = e + 1;
            continue;
        }
        if (len >= sizeof buf) {
            rc = mf_fail(err, MF_EFORMAT, "%s:%d: not a layer,expert row", path, line);
            break;
        }
        memcpy(buf, text + p, len);
        buf[len] = 0;
        p = e + 1;
        if (line == 1 && !strcmp(buf, "layer,expert")) continue;   /* the header, where one is written */
        const char *s = buf;
        long long l, x;
        if (!parse_int(&s, &l) || *s++ != ',' || !parse_int(&s, &x) || *s) {
            rc = mf_fail(err, MF_EFORMAT, "%s:%d: not a layer,expert row of two integers", path, line);
            break;
        }
        if (l < 0 || l >= cfg->n_layers || moe_index[l] < 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s:%d: layer %lld is not a MoE layer of the model (%d layers)", path, line, l, cfg->n_layers);
            break;
        }
        if (x < 0 || x >= E) {
            rc = mf_fail(err, MF_EFORMAT, "%s:%d: expert %lld outside the model's [0, %d)", path, line, x, E);
            break;
        }
        if (nr == cap) {
            cap *= 2;
            lay = mf_xrealloc(lay, cap * sizeof *lay);
            exp = mf_xrealloc(exp, cap * sizeof *exp);
            lno = mf_xrealloc(lno, cap * sizeof *lno);
        }
        lay[nr] = (int32_t)l;
        exp[nr] = (int32_t)x;
        lno[nr++] = line;
        if (nr > (size_t)MF_MAX_SEQ_TOKENS * (size_t)L * (size_t)(E > K ? E : K)) {
            rc = mf_fail(err, MF_EFORMAT, "%s:%d: more rows than a sequence of %d tokens has", path, line, MF_MAX_SEQ_TOKENS);
            break;
        }
    }
    if (!rc && !nr) rc = mf_fail(err, MF_EFORMAT, "%s: no layer,expert rows", path);
    /* blocks: runs of one layer; a ubatch is L blocks, one per MoE layer in order, of equal length */
    int32_t *ids = NULL;
    int tokens = 0, view_line = 0, view_t0 = 0, view_t1 = 0;
    bool flat = E > K;
    if (!rc) {
        ids = mf_xmalloc(sizeof(int32_t) * (nr / (size_t)K + 1) * (size_t)L * (size_t)K);
        size_t i = 0;
        while (i < nr && !rc) {
            size_t start = i, blen = 0;
            bool view_read = E > K;   /* every layer of this ubatch: argsort rows cut into k (below) */
            for (int m = 0; m < L && !rc; m++) {
                size_t j = i;
                while (j < nr && lay[j] == lay[i]) j++;
                if (i >= nr) {
                    rc = mf_fail(err, MF_EFORMAT, "%s: the rows end within a ubatch: MoE layer %d has none after line %d", path,
                                 m, lno[nr - 1]);
                    break;
                }
                if (moe_index[lay[i]] != m) {
                    rc = mf_fail(err, MF_EFORMAT, "%s:%d: layer %d where MoE layer %d (layer %d) was expected: a ubatch's rows run "
                                 "through the MoE layers in order", path, lno[i], lay[i], m, layer_of_moe[m]);
                    break;
                }
                const size_t len = j - i;
                /* the flat copy of the ffn_moe_topk view writes each token's whole argsort row, n_expert ids: every
                 * n_expert rows a permutation. Rows of real top-k ids can be one by chance in a short block, so
                 * this names the pattern only where the rows are also too many for the tokens (check_capture) */
                flat = flat && E > K && len % (size_t)E == 0 && distinct_in_blocks(exp + i, len, E);
                if (len % (size_t)K || (m > 0 && len != blen)) {
                    rc = mf_fail(err, MF_EFORMAT, "%s:%d: layer %d has %zu rows in this ubatch%s (top-%d: %s)", path, lno[i], lay[i],
                                 len, m ? "" : "", K, len % (size_t)K ? "not whole tokens" : "not as many as the first MoE layer's");
                    break;
                }
                blen = len;
                /* The ffn_moe_topk tensor is a view of the first k columns of an [n_tokens, n_expert] argsort; read as
                 * if contiguous (examples/moe-trace as first proposed) its k x n_tokens ids are the argsort's first
                 * rows: token 0's ranking of all n_expert, then token 1's, ..., cut into rows of k. The row count is
                 * right; the ids after the ubatch's first token are not its routing. Named where each layer of the
                 * ubatch holds at least two whole rankings, each a permutation of the experts, and distinct ids
                 * after them: by chance, real top-k rows are that with odds below (1/1820)^2 a layer at 16 experts. */
                view_read = view_read && len >= 2 * (size_t)E && distinct_in_blocks(exp + i, len, E);
                const size_t nt = len / (size_t)K;
                for (size_t t = 0; t < nt; t++)
                    for (int k = 0; k < K; k++)
                        ids[(((size_t)tokens + t) * (size_t)L + (size_t)m) * (size_t)K + (size_t)k] = exp[i + t * (size_t)K + (size_t)k];
                i = j;
            }
            if (!rc && view_read && !view_line) {
                view_line = lno[start];
                view_t0 = tokens;
                view_t1 = tokens + (int)(blen / (size_t)K);
            }
            if (!rc) tokens += (int)(blen / (size_t)K);
        }
    }
    if (!rc) {
        capture *c = new_capture(cs, path, -1);
        c->ids = ids;
        c->rows = tokens;
        c->layers = L;
        c->file_k = K;
        c->flat_line = flat ? lno[0] : 0;
        c->view_line = view_line;
        c->view_t0 = view_t0;
        c->view_t1 = view_t1;
        ids = NULL;
    }
    free(ids);
    free(lay);
    free(exp);
    free(lno);
    return rc;
}

/* ---- Hugging Face: router_logits in safetensors ------------------------------ */

static int read_hf(captures *cs, const char *path, const mf_config *cfg, mf_error *err) {
    mf_st_file *f = NULL;
    int rc = mf_st_open(&f, path, err);
    if (rc) return rc;
    const int L = cfg->n_moe_layers, E = cfg->n_experts, V = cfg->vocab;
    capture *c = new_capture(cs, path, -1);
    const mf_st_tensor *stacked = mf_st_find(f, "router_logits");
    int64_t rows = -1;
    if (stacked) {
        if (stacked->ndim != 3 || stacked->shape[0] != L || stacked->shape[2] != E || !mf_dtype_is_float(stacked->dtype))
            rc = mf_fail(err, MF_EFORMAT, "%s: router_logits must be a float tensor [%d, rows, %d] for this model", path, L, E);
        else rows = stacked->shape[1];
    } else {
        for (int l = 0; l < L && !rc; l++) {
            char name[64];
            snprintf(name, sizeof name, "router_logits.%d", l);
            const mf_st_tensor *t = mf_st_find(f, name);
            if (!t) rc = mf_fail(err, MF_EFORMAT, "%s: no %s (the model has %d MoE layers: router_logits.0 to .%d, or router_logits "
                                 "[%d, rows, %d])", path, name, L, L - 1, L, E);
            else if (t->ndim != 2 || t->shape[1] != E || !mf_dtype_is_float(t->dtype) || (rows >= 0 && t->shape[0] != rows))
                rc = mf_fail(err, MF_EFORMAT, "%s: %s must be a float tensor [rows, %d] with as many rows as router_logits.0", path, name, E);
            else rows = t->shape[0];
        }
    }
    if (!rc && (rows < 1 || rows > MF_MAX_SEQ_TOKENS))
        rc = mf_fail(err, MF_EFORMAT, "%s: router logits for %lld rows (a sequence has 1 to %d)", path, (long long)rows, MF_MAX_SEQ_TOKENS);
    if (!rc) {
        c->rows = (int)rows;
        c->layers = L;
        c->router = mf_xmalloc(sizeof(double) * (size_t)L * (size_t)rows * (size_t)E);
        for (int l = 0; l < L; l++) {
            const mf_st_tensor *t = stacked;
            size_t base = (size_t)l * (size_t)rows * (size_t)E;
            if (!stacked) {
                char name[64];
                snprintf(name, sizeof name, "router_logits.%d", l);
                t = mf_st_find(f, name);
                base = 0;
            }
            c->router_dtype = t->dtype;
            for (size_t j = 0; j < (size_t)rows * (size_t)E; j++)
                c->router[(size_t)l * (size_t)rows * (size_t)E + j] = mf_load_as_f64(t->data, t->dtype, base + j);
        }
        const mf_st_tensor *lg = mf_st_find(f, "logits");
        if (lg) {
            const int64_t *s = lg->shape;
            const bool ok = mf_dtype_is_float(lg->dtype) &&
                            ((lg->ndim == 2 && s[0] == rows && s[1] == V) || (lg->ndim == 3 && s[0] == 1 && s[1] == rows && s[2] == V));
            if (!ok) rc = mf_fail(err, MF_EFORMAT, "%s: logits must be a float tensor [%lld, %d] (or [1, %lld, %d])", path, (long long)rows, V,
                                  (long long)rows, V);
            else {
                c->logits = mf_xmalloc(sizeof(double) * (size_t)rows * (size_t)V);
                c->logits_dtype = lg->dtype;
                for (size_t j = 0; j < (size_t)rows * (size_t)V; j++) c->logits[j] = mf_load_as_f64(lg->data, lg->dtype, j);
            }
        }
    }
    mf_st_close(f);
    return rc;
}

/* ---- against the model -------------------------------------------------------- */

/* The expert id of capture c at (row, MoE layer m, slot k), in the file's layer indexing. */
static int64_t id_at(const capture *c, const mf_config *cfg, const int *layer_of_moe, int row, int m, int k) {
    const int l = c->layers == cfg->n_moe_layers ? m : layer_of_moe[m];
    return c->ids[((size_t)row * (size_t)c->layers + (size_t)l) * (size_t)cfg->top_k + (size_t)k];
}

/* A capture against its sequence (T tokens) and the model: its shape, the known failure patterns (named), then
 * every id. file_k: the ids per row the file holds (the .npy's third dimension). */
static int check_capture(mf_engine eng, const capture *c, const mf_prompt *p, const mf_config *cfg, mf_error *err) {
    const int K = cfg->top_k, E = cfg->n_experts, L = cfg->n_moe_layers, T = p->T;
    int layer_of_moe[MF_MAX_LAYERS];
    moe_layer_table(cfg, layer_of_moe);
    if (c->ids) {
        if (c->file_k != K)
            return mf_fail(err, MF_EFORMAT, "%s: %d expert ids per row; the model's top_k is %d", c->where, c->file_k, K);
        if (c->layers != cfg->n_layers && c->layers != L)
            return mf_fail(err, MF_EFORMAT, "%s: %d layers per row; the model has %d layers, %d of them MoE", c->where, c->layers,
                           cfg->n_layers, L);
    }
    /* rows the engine never wrote: its capture buffers are zero-filled, and a row of K zeros is no top-k */
    if (c->ids && K >= 2 && c->rows > 0) {
        int zero = 0;
        while (zero < c->rows) {
            bool all = true;
            for (int m = 0; m < L && all; m++)
                for (int k = 0; k < K && all; k++) all = id_at(c, cfg, layer_of_moe, zero, m, k) == 0;
            if (!all) break;
            zero++;
        }
        if (zero > 0 && eng == MF_ENGINE_SGLANG)
            return mf_fail(err, MF_EFORMAT, "%s (sequence %s): rows 0 to %d are all zero in every layer: the all-zero prompt rows that "
                           "SGLang's prefill/decode disaggregation returns (the prefill server's routing never reached the "
                           "response); capture on one server", c->where, p->id, zero - 1);
        if (zero > 0)
            return mf_fail(err, MF_EFORMAT, "%s (sequence %s): rows 0 to %d are all zero in every layer: rows the engine's "
                           "zero-filled capture buffer kept (never written), not routing", c->where, p->id, zero - 1);
    }
    if (c->rows != T && c->rows != T - 1 && c->flat_line)
        return mf_fail(err, MF_EFORMAT, "%s:%d (sequence %s): every %d rows of every layer are a permutation of all %d experts, %d "
                       "rows for %d tokens: the trace copied the ffn_moe_topk view flat (its rows are each token's whole "
                       "argsort ranking, not its top-%d); read it with its strides", c->where, c->flat_line, p->id, E, E,
                       c->rows * K, T, K);
    if ((c->rows == T || c->rows == T - 1) && c->view_line)
        return mf_fail(err, MF_EFORMAT, "%s:%d (sequence %s): the ubatch of tokens %d to %d holds, in every MoE layer, whole "
                       "rankings of all %d experts one after another (each %d rows a permutation), not each token's top-%d: the "
                       "trace read the ffn_moe_topk view as contiguous, so every token after a ubatch's first has another "
                       "token's lower-ranked experts (llama.cpp PR #28544's first moe-trace; traces of one token a batch are "
                       "unaffected); read the view with its strides", c->where, c->view_line, p->id, c->view_t0, c->view_t1 - 1,
                       E, E / K, K);
    if (c->rows != T && c->rows != T - 1)
        return mf_fail(err, MF_EFORMAT, "%s (sequence %s): %d rows; the sequence has %d tokens (a capture has one row per token, "
                       "or one fewer: the last token never ran)%s", c->where, p->id, c->rows, T,
                       eng == MF_ENGINE_LLAMACPP && c->rows > T ? "; a capture that includes llama.cpp's warmup pass has "
                                                                   "more: run with --no-warmup" : "");
    if (c->rows < 1) return mf_fail(err, MF_EFORMAT, "%s (sequence %s): no rows", c->where, p->id);
    if (!c->ids) return MF_OK;
    for (int r = 0; r < c->rows; r++)
        for (int m = 0; m < L; m++)
            for (int k = 0; k < K; k++) {
                const int64_t x = id_at(c, cfg, layer_of_moe, r, m, k);
                if (x < 0 || x >= E)
                    return mf_fail(err, MF_EFORMAT, "%s (sequence %s): row %d, layer %d, slot %d: expert %lld outside the model's [0, %d)",
                                   c->where, p->id, r, layer_of_moe[m], k, (long long)x, E);
                for (int q = 0; q < k; q++)
                    if (id_at(c, cfg, layer_of_moe, r, m, q) == x)
                        return mf_fail(err, MF_EFORMAT, "%s (sequence %s): row %d, layer %d: expert %lld twice (slots %d and %d); a top-%d "
                                       "choice has distinct experts", c->where, p->id, r, layer_of_moe[m], (long long)x, q, k, K);
            }
    return MF_OK;
}

/* ---- the import ---------------------------------------------------------------- */

static int read_file_captures(mf_engine eng, captures *cs, const char *path, const mf_config *cfg, mf_error *err) {
    if (eng == MF_ENGINE_HF) return read_hf(cs, path, cfg, err);
    char *text;
    size_t n;
    int rc = mf_read_file(path, &text, &n, err);
    if (rc) return rc;
    if (eng == MF_ENGINE_VLLM) rc = read_vllm(cs, path, (const uint8_t *)text, n, err);
    else if (eng == MF_ENGINE_SGLANG) rc = read_sglang(cs, path, text, n, cfg, err);
    else rc = read_llamacpp(cs, path, text, n, cfg, err);
    free(text);
    return rc;
}

int mf_import_engine(mf_engine eng, const char *const *files, int n_files, const char *model_dir, const char *tokens_path,
                     const char *out_dir, mf_error *err) {
    char path[8300];
    mf_config cfg;
    if (!mf_path_join(path, sizeof path, model_dir, "config.json")) return mf_fail(err, MF_EINVAL, "path too long");
    int rc = mf_config_load(&cfg, path, err);
    if (rc) return rc;
    if (cfg.arch == MF_ARCH_GPT_OSS)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: importing captures of gpt_oss is not supported yet: its experts and "
                       "weights follow its own router (top-k of the biased logits, softmax over the k)", model_dir);
    if (cfg.route_rule != MF_ROUTE_SOFTMAX_TOPK && cfg.route_rule != MF_ROUTE_SOFTMAX_TOPK_RENORM)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: importing captures of %s is not supported: its experts cannot be "
                       "derived from router logits alone (the router ranks biased sigmoid scores within groups)",
                       model_dir, cfg.model_type);
    if (cfg.n_moe_layers < 1) return mf_fail(err, MF_EINVAL, "%s: the model has no MoE layers: there is no routing to import", model_dir);
    if (n_files < 1) return mf_fail(err, MF_EINVAL, "import %s: no capture files", mf_engine_name(eng));
    char wdigest[33] = "unknown";
    mf_checkpoint *ck = NULL;
    if (mf_checkpoint_open(&ck, model_dir, NULL) == MF_OK) {   /* weights are optional: the config names the model */
        memcpy(wdigest, ck->weights_digest, sizeof wdigest);
        mf_checkpoint_close(ck);
    }
    mf_prompts in = {0};
    char tokpath[8300];
    const bool have_tok = mf_path_join(tokpath, sizeof tokpath, model_dir, "tokenizer.json") && mf_path_exists(tokpath);
    if ((rc = mf_prompts_load_text(&in, tokens_path, cfg.vocab, have_tok ? tokpath : NULL, err))) return rc;
    captures cs = {0};
    for (int i = 0; i < n_files && !rc; i++) {
        rc = read_file_captures(eng, &cs, files[i], &cfg, err);
        if (!rc && cs.n > in.n)
            rc = mf_fail(err, MF_EINVAL, "%s: more captures than %s has sequences (%zu): the i-th capture is the i-th line", files[i],
                         tokens_path, in.n);
    }
    if (!rc && cs.n != in.n)
        rc = mf_fail(err, MF_EINVAL, "%zu captures for the %zu sequences of %s: the i-th capture is the i-th line", cs.n, in.n, tokens_path);
    for (size_t i = 0; i < cs.n && !rc; i++) rc = check_capture(eng, &cs.v[i], &in.seq[i], &cfg, err);
    /* the run's sequences: each as far as its capture goes */
    const size_t n = cs.n;
    mf_prompts prompts = {mf_xcalloc(n + 1, sizeof(mf_prompt)), rc ? 0 : n, ""};
    bool dropped_last = false, have_logits = !rc && n > 0;
    if (!rc) {
        mf_digest_state *ds = mf_digest_new();
        for (size_t i = 0; i < n; i++) {
            mf_prompt *p = &prompts.seq[i];
            p->id = mf_xstrdup(in.seq[i].id);
            p->T = cs.v[i].rows;
            p->answer = -1;
            p->tokens = mf_xmalloc(sizeof(int32_t) * (size_t)p->T);
            memcpy(p->tokens, in.seq[i].tokens, sizeof(int32_t) * (size_t)p->T);
            dropped_last |= p->T < in.seq[i].T;
            have_logits &= cs.v[i].logits != NULL;
            mf_digest_update(ds, p->id, strlen(p->id) + 1);
            mf_digest_update(ds, p->tokens, sizeof(int32_t) * (size_t)p->T);
        }
        mf_digest_final(ds, prompts.digest);
    }
    char tmp[4200] = "";
    if (!rc) rc = rundir_import_dest(out_dir, tmp, sizeof tmp, err);
    mf_run_writer *w = NULL;
    if (!rc) {
        const bool hf = eng == MF_ENGINE_HF;
        unsigned lacks = (hf ? 0 : MF_LACKS_GATES | MF_LACKS_ROUTER) | (cfg.has_shared_expert ? MF_LACKS_SHARED : 0) |
                         (have_logits ? 0 : MF_LACKS_LOGITS);
        /* the precision the engine ran in is not in its capture: the manifest says so rather than guess */
        mf_precision prec;
        mf_precision_parse(&prec, "fp32", NULL);
        snprintf(prec.name, sizeof prec.name, "unknown (%s capture)", mf_engine_name(eng));
        if (hf && cs.v[0].router_dtype != MF_DTYPE_INVALID) prec.part[MF_PART_ROUTER] = cs.v[0].router_dtype;
        if (have_logits) prec.part[MF_PART_HEAD] = cs.v[0].logits_dtype;
        char from[4200];
        int used = snprintf(from, sizeof from, "%s", mf_engine_name(eng));
        json_t *jcap = json_object(), *jf = json_array(), *jl = json_array();
        for (int i = 0; i < n_files; i++) {
            json_array_append_new(jf, json_string(files[i]));
            if (used < (int)sizeof from - 1) used += snprintf(from + used, sizeof from - (size_t)used, " %s", files[i]);
        }
        json_object_set_new(jcap, "engine", json_string(mf_engine_name(eng)));
        json_object_set_new(jcap, "files", jf);
        json_object_set_new(jcap, "tokens", json_string(tokens_path));
        json_object_set_new(jcap, "experts", json_string(hf ? "derived from the router logits (canonical top-k of the raw scores)"
                                                               : "as the engine recorded them"));
        json_object_set_new(jcap, "rows", json_string(dropped_last ? "one per token; sequences whose capture has one row fewer "
                                                                        "than their tokens end before their last token"
                                                                      : "one per token"));
        static const char *const names[] = {"gate_weights", "router_logits", "shared_gates", "logits"};
        for (int b = 0; b < 4; b++)
            if (lacks & (1u << b)) json_array_append_new(jl, json_string(names[b]));
        json_object_set_new(jcap, "lacks", jl);
        mf_run_info info = {.model_dir = model_dir, .prec = &prec, .device = "imported", .numerics = "unknown",
                            .record = have_logits ? MF_RECORD_LOGITS : MF_RECORD_ROUTING, .input_path = tokens_path,
                            .prompts = &prompts, .cfg = &cfg, .weights_digest = wdigest, .imported_from = from,
                            .capture = jcap, .lacks = lacks, .experts_recorded = !hf};
        rc = mf_run_create(&w, tmp, &info, false, err);
        json_decref(jcap);
        const int L = cfg.n_moe_layers, K = cfg.top_k, E = cfg.n_experts;
        int layer_of_moe[MF_MAX_LAYERS];
        moe_layer_table(&cfg, layer_of_moe);
        for (size_t i = 0; i < n && !rc; i++) {
            const capture *c = &cs.v[i];
            const int T = c->rows;
            mf_seq_result r = {.T = T, .n_moe = L, .k = K, .E = E, .V = cfg.vocab, .H = cfg.hidden};
            r.topk_ids = mf_xmalloc(sizeof(uint16_t) * (size_t)L * (size_t)T * (size_t)K);
            if (c->ids) {
                for (int m = 0; m < L; m++)
                    for (int t = 0; t < T; t++)
                        for (int k = 0; k < K; k++)
                            r.topk_ids[((size_t)m * (size_t)T + (size_t)t) * (size_t)K + (size_t)k] = (uint16_t)id_at(c, &cfg, layer_of_moe, t, m, k);
            } else {
                /* Hugging Face's scores: the experts as the CroVA import derives them, weights from the fp32 softmax */
                r.router = mf_xmalloc(sizeof(double) * (size_t)L * (size_t)T * (size_t)E);
                memcpy(r.router, c->router, sizeof(double) * (size_t)L * (size_t)T * (size_t)E);
                r.topk_w = mf_xmalloc(sizeof(double) * (size_t)L * (size_t)T * (size_t)K);
                rundir_derive_experts(&cfg, r.router, (size_t)L * (size_t)T, r.topk_ids, r.topk_w);
                if (have_logits) {
                    r.logits = mf_xmalloc(sizeof(double) * (size_t)T * (size_t)cfg.vocab);
                    memcpy(r.logits, c->logits, sizeof(double) * (size_t)T * (size_t)cfg.vocab);
                }
            }
            rc = mf_run_writer_add(w, &prompts.seq[i], &r, err);
            mf_seq_result_free(&r);
        }
        if (!rc) rc = mf_run_writer_close(w, err);
        if (!rc && rename(tmp, out_dir) != 0)
            rc = mf_fail(err, MF_EIO, "%s: cannot rename the import into place: %s", out_dir, strerror(errno));
    }
    mf_run_writer_free(w);
    if (rc && tmp[0]) mf_run_remove_dir(tmp);
    captures_free(&cs);
    mf_prompts_free(&prompts);
    mf_prompts_free(&in);
    return rc;
}
