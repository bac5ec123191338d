/* Linear layers and activation-by-activation products on top of the packed
 * kernels, with the rounding a precision policy asks for. */
#include "mf_numerics.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void mf_linear_free(mf_linear *L) {
    free(L->bias);
    L->bias = NULL;
}

/* Columns of W converted to instruction operands at a time: the operand block
 * stays a few megabytes whatever the weight's size. */
#define EMU_COLS 256

/* Weight blocks decoded for the emulated instructions, kept between products: a decode step multiplies one row
 * by every weight, where converting and decoding the weight costs ten times the product itself. A block is
 * found by the digest of its stored bytes (not its address: a freed model's mapping may be reused) with its
 * shape, dtype, what of the instruction its decoding depends on, and the kernel path; the cache holds at most MF_EMU_CACHE_BYTES and then stops growing
 * (products past it decode as before). Entries live as long as the process. */
#define EMU_CACHE_SLOTS 4096

typedef struct emu_entry {
    char digest[33];
    int n, k;
    size_t rs, cs;
    mf_dtype dtype;
    mf_mat_scales q;   /* a block-scaled weight's scale layout and rounding (the scales' bytes are in the digest) */
    /* what the decoding depends on: the operands' formats, the instruction's k and kind, the zero rule (a
     * schedule's address is no key: each trace parses its own) */
    mf_fmt a_fmt, b_fmt;
    int instr_k;
    mf_mma_kind kind;
    bool zero_excluded;
    mf_emu_bpack *pack;
} emu_entry;

static struct {
    pthread_mutex_t lock;
    emu_entry *slots;   /* open addressing over the digest */
    size_t bytes;
    size_t used;
} emu_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t slot_of(const char *digest) {
    size_t h = 0;
    for (int i = 0; i < 16; i++) h = h * 16 + (size_t)(digest[i] <= '9' ? digest[i] - '0' : digest[i] - 'a' + 10);
    return h % EMU_CACHE_SLOTS;
}

static bool same_scales(const mf_mat_scales *x, const mf_mat_scales *y) {
    return x->kind == y->kind && (x->kind == MF_WQ_NONE || (x->dtype == y->dtype && x->bn == y->bn && x->bk == y->bk &&
                                                             x->rs == y->rs && x->round == y->round));
}

static bool same_key(const emu_entry *e, const char *digest, const mf_mat *b, int n, const mf_kschedule *ks) {
    return e->pack && !strcmp(e->digest, digest) && e->n == n && e->k == b->k && e->rs == b->rs && e->cs == b->cs &&
           e->dtype == b->dtype && same_scales(&e->q, &b->q) && e->a_fmt == ks->instr.a_fmt && e->b_fmt == ks->instr.b_fmt &&
           e->instr_k == ks->instr.k && e->kind == ks->instr.kind && e->zero_excluded == ks->instr.zero_products_excluded &&
           mf_emu_bpack_current(e->pack);
}

/* The cached pack of columns [j0, j0 + n) of b, or NULL. */
static const mf_emu_bpack *cache_find(const char *digest, const mf_mat *b, int n, const mf_kschedule *ks) {
    const mf_emu_bpack *found = NULL;
    pthread_mutex_lock(&emu_cache.lock);
    if (emu_cache.slots)
        for (size_t i = slot_of(digest), tries = 0; tries < EMU_CACHE_SLOTS && emu_cache.slots[i].pack && !found;
             i = (i + 1) % EMU_CACHE_SLOTS, tries++)
            if (same_key(&emu_cache.slots[i], digest, b, n, ks)) found = emu_cache.slots[i].pack;
    pthread_mutex_unlock(&emu_cache.lock);
    return found;
}

/* Keeps pack when there is room (true), else the caller frees it after use. */
static bool cache_add(const char *digest, const mf_mat *b, int n, const mf_kschedule *ks, mf_emu_bpack *pack) {
    const size_t bytes = mf_emu_bpack_bytes(pack);
    bool kept = false;
    pthread_mutex_lock(&emu_cache.lock);
    if (!emu_cache.slots) emu_cache.slots = calloc(EMU_CACHE_SLOTS, sizeof *emu_cache.slots);
    if (emu_cache.slots && emu_cache.bytes + bytes <= MF_EMU_CACHE_BYTES && emu_cache.used < EMU_CACHE_SLOTS / 2) {
        size_t i = slot_of(digest);
        while (emu_cache.slots[i].pack) i = (i + 1) % EMU_CACHE_SLOTS;
        emu_entry *e = &emu_cache.slots[i];
        memcpy(e->digest, digest, 33);
        e->n = n, e->k = b->k, e->rs = b->rs, e->cs = b->cs, e->dtype = b->dtype, e->pack = pack;
        e->q = b->q;
        e->q.data = NULL;   /* the key is the digest, never an address */
        e->a_fmt = ks->instr.a_fmt, e->b_fmt = ks->instr.b_fmt, e->instr_k = ks->instr.k, e->kind = ks->instr.kind;
        e->zero_excluded = ks->instr.zero_products_excluded;
        emu_cache.bytes += bytes;
        emu_cache.used++;
        kept = true;
    }
    pthread_mutex_unlock(&emu_cache.lock);
    return kept;
}

/* The product as a vendor's instruction computes it: operands to their bit
 * patterns (exact: they hold bf16 or f16 values), the emulated GEMM over
 * blocks of W's columns, fp32 results. A is doubles (ad) or floats (af). */
static void emulate(const mf_kschedule *ks, const mf_mm *mm, const double *ad, const float *af, int M, size_t lda,
                    const mf_mat *b, float *cf) {
    const int N = b->n, K = b->k;
    const bool bf = ks->instr.a_fmt == MF_FMT_BF16;
    const int nb = N < EMU_COLS ? N : EMU_COLS;
    uint64_t *A = mf_xmalloc((size_t)M * K * sizeof(uint64_t)), *B = mf_xmalloc((size_t)K * nb * sizeof(uint64_t));
    uint64_t *C = mf_xmalloc((size_t)M * nb * sizeof(uint64_t));
    float *rows = b->q.kind != MF_WQ_NONE ? mf_xmalloc((size_t)K * nb * sizeof(float)) : NULL;
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            double v = ad ? ad[(size_t)i * lda + k] : af[(size_t)i * lda + k];
            A[(size_t)i * K + k] = bf ? mf_f64_to_bf16(v) : mf_f64_to_f16(v);
        }
    /* a block can be kept when its rows are whole and adjacent in memory (a checkpoint's [out, in] weight) */
    const bool cacheable = mf_emu_packable(ks, K) && b->cs == 1 && b->rs == (size_t)K;
    for (int j0 = 0; j0 < N; j0 += nb) {
        const int w = N - j0 < nb ? N - j0 : nb;
        char digest[33];
        const mf_emu_bpack *cached = NULL;
        if (cacheable) {   /* the codes' bytes, and a block-scaled weight's scales with them */
            const void *codes, *scales;
            size_t nc, ns;
            mf_mat_row_bytes(b, j0, w, &codes, &nc, &scales, &ns);
            mf_digest_state *d = mf_digest_new();
            mf_digest_update(d, codes, nc);
            if (ns) {   /* with where the block rows begin: the same bytes shifted are other values */
                const int phase = j0 % b->q.bn;
                mf_digest_update(d, scales, ns);
                mf_digest_update(d, &phase, sizeof phase);
            }
            mf_digest_final(d, digest);
            cached = cache_find(digest, b, w, ks);
        }
        if (!cached && b->q.kind != MF_WQ_NONE) {   /* block-scaled: widened a row at a time, transposed in tiles */
            for (int j = 0; j < w; j++) mf_mat_row_f32(b, j0 + j, 0, K, rows + (size_t)j * K);
            for (int kt = 0; kt < K; kt += 32)
                for (int j = 0; j < w; j++) {
                    const float *r = rows + (size_t)j * K;
                    for (int k = kt; k < K && k < kt + 32; k++)
                        B[(size_t)k * w + j] = bf ? mf_f32_to_bf16(r[k]) : mf_f32_to_f16(r[k]);
                }
        } else if (!cached) {
            for (int k = 0; k < K; k++)
                for (int j = 0; j < w; j++) {
                    const double v = mf_mat_get(b, j0 + j, k);
                    B[(size_t)k * w + j] = bf ? mf_f64_to_bf16(v) : mf_f64_to_f16(v);
                }
        }
        if (cached) {
            mf_emu_gemm_packed(ks, M, A, cached, NULL, C, mm->threads);
        } else if (cacheable) {
            mf_emu_bpack *pack = mf_emu_pack_b(ks, w, K, B, mm->threads);
            mf_emu_gemm_packed(ks, M, A, pack, NULL, C, mm->threads);
            if (!cache_add(digest, b, w, ks, pack)) mf_emu_bpack_free(pack);
        } else {
            mf_emu_gemm(ks, M, w, K, A, B, NULL, C, mm->threads);
        }
        for (int i = 0; i < M; i++)
            for (int j = 0; j < w; j++) {
                uint32_t u = (uint32_t)C[(size_t)i * w + j];
                memcpy(&cf[(size_t)i * N + j0 + j], &u, 4);
            }
    }
    free(A);
    free(B);
    free(C);
    free(rows);
}

/* epilogue: the fp32 sums (+ bias in fp32), then one rounding to the output
 * dtype, into rows of doubles (cd) or floats (cs) */
static void epilogue(const mf_mm *mm, float *cf, int M, int N, const double *bias, double *cd, float *cs, size_t ldc,
                     bool par) {
    const mf_dtype out = mm->out;
#pragma omp parallel for num_threads(mm->threads) if (par)
    for (int i = 0; i < M; i++) {
        float *ci = cf + (size_t)i * N;
        if (bias)
            for (int j = 0; j < N; j++) ci[j] = ci[j] + (float)bias[j];
        if (cs) {
            float *co = cs + (size_t)i * ldc;
            if (out == MF_BF16) {
                for (int j = 0; j < N; j++) co[j] = mf_bf16_to_f32(mf_f32_to_bf16(ci[j]));
            } else if (out == MF_F32 || out == MF_F64) {
                if (co != ci) memcpy(co, ci, (size_t)N * sizeof(float));
            } else {
                for (int j = 0; j < N; j++) co[j] = (float)mf_round_to(out, ci[j]);
            }
            continue;
        }
        double *co = cd + (size_t)i * ldc;
        if (out == MF_BF16) {
            for (int j = 0; j < N; j++) co[j] = mf_bf16_to_f32(mf_f32_to_bf16(ci[j]));
        } else if (out == MF_F32 || out == MF_F64) {
            for (int j = 0; j < N; j++) co[j] = ci[j];
        } else {
            for (int j = 0; j < N; j++) co[j] = mf_round_to(out, ci[j]);
        }
    }
}

/* An FP8 weight under fp8=w8a8: its codes times the activations' (numerics/w8a8.c), whatever the policy. */
static bool w8a8(const mf_mm *mm, const mf_mat *b) {
    return mm->numerics && mm->numerics->fp8_products == MF_FP8_W8A8 && b->q.kind == MF_WQ_FP8_BLOCK;
}

static void run(const mf_mm *mm, const double *a, int M, size_t lda, const mf_mat *b, const double *bias, double *c,
                size_t ldc, mf_tri tri) {
    const int N = b->n, K = b->k;
    if (M <= 0 || N <= 0) return;
    if (mm->compute == MF_F64) {
        double *tmp = mf_xmalloc((size_t)M * N * sizeof(double));
        if (tri == MF_TRI_COLS) memset(tmp, 0, (size_t)M * N * sizeof(double));
        mf_gemm_f64(M, a, lda, b, tmp, (size_t)N, mm->threads, tri);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double v = tmp[(size_t)i * N + j];
                if (bias) v += bias[j];
                c[(size_t)i * ldc + j] = mf_round_to(mm->out, v);
            }
        free(tmp);
        return;
    }
    float *af = mf_xmalloc((size_t)M * K * sizeof(float));
    float *cf = mf_xmalloc((size_t)M * N * sizeof(float));
    const bool par = mm->threads > 1 && (size_t)M * (K + N) >= (1u << 15);
    const mf_kschedule *ks = mm->numerics ? mf_numerics_schedule(mm->numerics, mm->in) : NULL;
    if (w8a8(mm, b)) {
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) af[(size_t)i * K + k] = (float)a[(size_t)i * lda + k];
        mf_w8a8_gemm(&mm->numerics->fp8, M, af, (size_t)K, b, cf, (size_t)N, mm->threads);
    } else if (ks) {
        emulate(ks, mm, a, NULL, M, lda, b, cf);
    } else {
#pragma omp parallel for num_threads(mm->threads) if (par)
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) af[(size_t)i * K + k] = (float)a[(size_t)i * lda + k];
        if (tri == MF_TRI_COLS) memset(cf, 0, (size_t)M * N * sizeof(float));
        mf_gemm_f32(M, af, (size_t)K, b, cf, (size_t)N, mm->threads, tri);
    }
    epilogue(mm, cf, M, N, bias, c, NULL, ldc, par);
    free(af);
    free(cf);
}

/* The same with fp32 activations in and out (the compute type is fp32): no
 * operand conversion; the sums land in the output itself where nothing is
 * left to round. */
static void run_f32(const mf_mm *mm, const float *a, int M, size_t lda, const mf_mat *b, const double *bias, float *c,
                    size_t ldc, mf_tri tri) {
    const int N = b->n;
    if (M <= 0 || N <= 0) return;
    const bool par = mm->threads > 1 && (size_t)M * (b->k + N) >= (1u << 15);
    const mf_kschedule *ks = mm->numerics ? mf_numerics_schedule(mm->numerics, mm->in) : NULL;
    const bool q8 = w8a8(mm, b);
    const bool in_place = !ks && !q8 && !bias && (mm->out == MF_F32 || mm->out == MF_F64) && ldc == (size_t)N;
    float *cf = in_place ? c : mf_xmalloc((size_t)M * N * sizeof(float));
    if (q8) {
        mf_w8a8_gemm(&mm->numerics->fp8, M, a, lda, b, cf, (size_t)N, mm->threads);
    } else if (ks) {
        emulate(ks, mm, NULL, a, M, lda, b, cf);
    } else {
        if (tri == MF_TRI_COLS) memset(cf, 0, (size_t)M * N * sizeof(float));
        mf_gemm_f32(M, a, lda, b, cf, (size_t)N, mm->threads, tri);
    }
    if (in_place) return;
    epilogue(mm, cf, M, N, bias, NULL, c, ldc, par);
    free(cf);
}

void mf_linear_apply(const mf_mm *mm, const mf_linear *L, const double *x, int M, double *y) {
    run(mm, x, M, (size_t)L->in, &L->w, L->bias, y, (size_t)L->out, MF_TRI_NONE);
}

void mf_matmul(const mf_mm *mm, const double *a, int M, size_t lda, const mf_mat *b, double *c, size_t ldc, mf_tri tri) {
    run(mm, a, M, lda, b, NULL, c, ldc, tri);
}

void mf_linear_apply_f32(const mf_mm *mm, const mf_linear *L, const float *x, int M, float *y) {
    run_f32(mm, x, M, (size_t)L->in, &L->w, L->bias, y, (size_t)L->out, MF_TRI_NONE);
}

void mf_matmul_f32(const mf_mm *mm, const float *a, int M, size_t lda, const mf_mat *b, float *c, size_t ldc, mf_tri tri) {
    run_f32(mm, a, M, lda, b, NULL, c, ldc, tri);
}

double mf_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

double mf_act_apply(mf_act act, double x) {
    switch (act) {
    case MF_ACT_SILU: return x / (1.0 + exp(-x));
    case MF_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MF_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    return x;
}

