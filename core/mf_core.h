/* moeflip core: status codes and messages, dtypes and exact conversions,
 * files (mmap, atomic replace), digests, logging and progress.
 * Everything above core/ reports failure the same way: a function returns
 * MF_OK (0) or a negative MF_E* code and fills an mf_error with one line
 * that names the file, tensor, sequence or position at fault. */
#ifndef MF_CORE_H
#define MF_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>

#define MF_VERSION "0.1.0"

/* ---- status ------------------------------------------------------------ */

enum {
    MF_OK = 0,
    MF_EINVAL = -1,      /* bad argument or bad input data */
    MF_EIO = -2,         /* a file could not be read or written */
    MF_EFORMAT = -3,     /* a file is malformed */
    MF_ENOMEM = -4,
    MF_EUNSUPPORTED = -5,
    MF_EDIGEST = -6,     /* a file's content does not match its recorded digest */
    MF_EMISMATCH = -7,   /* two things that must agree do not */
};

typedef struct mf_error {
    int code;
    char msg[1024];
} mf_error;

/* Sets err (if not NULL) and returns code, so callers can `return mf_fail(...)`. */
int mf_fail(mf_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes an existing message with more context ("loading X: <old message>"). */
int mf_fail_wrap(mf_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *mf_strerror(int code);

/* ---- UTF-8 -------------------------------------------------------------
 * Messages carry names read from files (ids, paths, manifest strings): they
 * are cut only between characters, and bytes that are not UTF-8 are shown as
 * '?', so that every message can go into JSON (the collector's answers). */

/* Length of the well-formed UTF-8 character at p (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF) within the n bytes left, 0 when there is none. */
int mf_utf8_char(const unsigned char *p, size_t n);
/* Makes s (NUL-terminated) valid UTF-8 in place: every byte that starts no character becomes '?'. */
void mf_utf8_scrub(char *s);
/* The number of characters in the valid UTF-8 string s (bytes that start none count as one each). */
size_t mf_utf8_length(const char *s);

/* ---- dtypes ------------------------------------------------------------ */

typedef enum mf_dtype {
    MF_DTYPE_INVALID = 0,
    MF_BF16, MF_F16, MF_F32, MF_F64,
    MF_I8, MF_U8, MF_I16, MF_U16, MF_I32, MF_U32, MF_I64, MF_U64, MF_BOOL,
    MF_F8E4M3, MF_F8E5M2,
    MF_DTYPE_COUNT
} mf_dtype;

size_t mf_dtype_size(mf_dtype t);
/* Safetensors spelling ("BF16", "F32", ...). */
const char *mf_dtype_name(mf_dtype t);
mf_dtype mf_dtype_from_name(const char *name);
bool mf_dtype_is_float(mf_dtype t);

/* Exact conversions, round-to-nearest-even, NaN kept quiet, Inf kept. These and the rounding below are
 * compiled for the GPUs too (MF_HD): runtime/gpu's kernels round with this code, so a GPU run rounds as the
 * CPU's does by construction. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define MF_HD __host__ __device__
#define MF_HD_COLD __host__ __device__ __noinline__   /* rare paths kept out of the kernels' hot loops */
#else
#define MF_HD
#define MF_HD_COLD
#endif
MF_HD static inline uint32_t mf_f32_bits(float f) {
    union { float f; uint32_t u; } v = { f };
    return v.u;
}
MF_HD static inline float mf_bits_f32(uint32_t u) {
    union { uint32_t u; float f; } v = { u };
    return v.f;
}
MF_HD static inline float mf_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
MF_HD static inline uint16_t mf_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);   /* quiet NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
MF_HD static inline float mf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    return mf_bits_f32(exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp - 15 + 127) << 23) | (man << 13));
}

/* Rounds a double to a binary format with `mant` explicit fraction bits, exponent range [emin, emax]
 * (unbiased, normal numbers), gradual underflow; past the largest finite value, infinity. The result is a
 * double (exact). */
MF_HD static inline double mf_round_to_format(double x, int mant, int emin, int emax) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e);           /* x = f * 2^e, 0.5 <= |f| < 1, so the leading bit weighs 2^(e-1) */
    int exp = e - 1;
    if (exp < emin) exp = emin;   /* subnormal: quantum fixed by emin */
    double quantum = ldexp(1.0, exp - mant);
    double y = nearbyint(x / quantum) * quantum;   /* x / quantum exact (a power of two); nearest even */
    double maxv = ldexp(2.0 - ldexp(1.0, -mant), emax);
    if (fabs(y) > maxv) return copysign((double)INFINITY, x);
    return y;
}

/* "Round through" helpers: the value a tensor of that dtype would hold. Fast paths round the double's bits
 * directly (nearest even) when the result is a normal number of the target format; zeros, subnormals,
 * overflow and NaN take mf_round_to_format (a NaN becomes the format's quiet NaN, as stored). */
MF_HD static inline double mf_round_f32(double x) { return (double)(float)x; }
MF_HD static inline double mf_round_bits_(double x, int drop) {
    union { double d; uint64_t u; } v = { x };
    const uint64_t half = (1ull << (drop - 1)) - 1;
    v.u += half + ((v.u >> drop) & 1);
    v.u &= ~((1ull << drop) - 1);
    return v.d;
}
MF_HD_COLD static inline double mf_round_bf16_slow(double x) {
    return isnan(x) ? (double)mf_bf16_to_f32(mf_f32_to_bf16((float)x)) : mf_round_to_format(x, 7, -126, 127);
}
MF_HD_COLD static inline double mf_round_f16_slow(double x) {
    return isnan(x) ? (double)mf_f16_to_f32(signbit(x) ? 0xfe00u : 0x7e00u) : mf_round_to_format(x, 10, -14, 15);
}
MF_HD static inline double mf_round_bf16(double x) {
    double a = x < 0 ? -x : x;
    /* normal bf16 range with room to round up: [2^-126, 2^127] */
    if (a >= 0x1p-126 && a <= 0x1p127) return mf_round_bits_(x, 52 - 7);
    if (a == 0) return x;
    return mf_round_bf16_slow(x);
}
MF_HD static inline double mf_round_f16(double x) {
    double a = x < 0 ? -x : x;
    if (a >= 0x1p-14 && a <= 0x1p15) return mf_round_bits_(x, 52 - 10);
    if (a == 0) return x;
    return mf_round_f16_slow(x);
}

/* One rounding, straight from double, to the format's bits. */
MF_HD static inline uint16_t mf_f64_to_bf16(double d) {
    return (uint16_t)(mf_f32_bits((float)mf_round_bf16(d)) >> 16);   /* the rounded value is a bf16 (or its quiet NaN) */
}
MF_HD static inline uint16_t mf_f64_to_f16(double d) {
    if (isnan(d)) return (uint16_t)(signbit(d) ? 0xfe00u : 0x7e00u);
    const double r = mf_round_f16(d), a = fabs(r);   /* exactly representable in fp16, or +-Inf */
    const uint16_t sign = signbit(r) ? 0x8000u : 0;
    if (isinf(a)) return sign | 0x7c00u;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    const int exp = e - 1;
    if (exp < -14) return sign | (uint16_t)(a * 16777216.0);   /* subnormal: a / 2^-24 */
    return sign | (uint16_t)((exp + 15) << 10) | (uint16_t)((ldexp(a, -exp) - 1.0) * 1024.0);
}
uint16_t mf_f32_to_f16(float f);

/* F64 (or anything else): identity; F32, BF16, F16 as above. */
static inline double mf_round_to(mf_dtype t, double x) {
    switch (t) {
    case MF_F32: return mf_round_f32(x);
    case MF_BF16: return mf_round_bf16(x);
    case MF_F16: return mf_round_f16(x);
    default: return x;
    }
}

/* The same for an fp32 value, as a float: mf_round_to(t, x) exactly (BF16 by
 * its bits, nearest even; tests/test_dtype.c checks the two agree). */
static inline float mf_roundf_to(mf_dtype t, float x) {
    switch (t) {
    case MF_BF16: return mf_bf16_to_f32(mf_f32_to_bf16(x));
    case MF_F16: return (float)mf_round_f16(x);
    default: return x;
    }
}

/* Reads element i of a raw buffer of float dtype t as double (exact). */
double mf_load_as_f64(const void *buf, mf_dtype t, size_t i);
/* One FP8 E4M3 (e4m3fn) byte's value. */
double mf_f8e4m3_to_f64(uint8_t b);
/* x to E4M3 (e4m3fn) bits, nearest even, saturating: a magnitude past 448 gives +-448 (0x7e / 0xfe), as PTX's
 * cvt.rn.satfinite.e4m3x2.f32 and a cast after torch.clamp(x, -448, 448) do; below the smallest subnormal
 * 2^-9 the nearest even is zero (with x's sign), and a NaN gives 0x7f. */
uint8_t mf_f32_to_f8e4m3_sat(float x);
/* Stores x into element i of a buffer of float dtype t (RNE). */
void mf_store_from_f64(void *buf, mf_dtype t, size_t i, double x);

/* ---- files ------------------------------------------------------------- */

typedef struct mf_mmap {
    const uint8_t *data;
    size_t size;
} mf_mmap;

int mf_mmap_open(mf_mmap *m, const char *path, mf_error *err);
/* A file descriptor for reading path, if it is a regular file; a FIFO, directory, socket or device is refused
 * at once, naming what it is, without waiting for a writer. MF_EIO (negative) on failure. */
struct stat;
int mf_open_regular(const char *path, struct stat *st, mf_error *err);
void mf_mmap_close(mf_mmap *m);

/* Reads a whole file into a malloc'ed, NUL-terminated buffer; an xz-compressed
 * file is decompressed. */
int mf_read_file(const char *path, char **out, size_t *len, mf_error *err);
/* Decompresses xz data into a malloc'ed, NUL-terminated buffer. */
int mf_xz_decode(const void *in, size_t n, char **out, size_t *out_len);

/* Crash-safe file replacement: data goes to "<path>.tmp.<pid>", is flushed
 * with fsync, renamed over path, and the directory is fsync'ed. A reader sees
 * the old file or the new one, never a mix. */
typedef struct mf_atomic_file {
    FILE *fp;
    char path[4096];
    char tmp[4200];
} mf_atomic_file;

int mf_atomic_open(mf_atomic_file *af, const char *path, mf_error *err);
int mf_atomic_write(mf_atomic_file *af, const void *data, size_t len, mf_error *err);
int mf_atomic_commit(mf_atomic_file *af, mf_error *err);   /* flush, fsync, rename */
void mf_atomic_abort(mf_atomic_file *af);                   /* drop the temporary */
int mf_write_file_atomic(const char *path, const void *data, size_t len, mf_error *err);

int mf_mkdir_p(const char *path, mf_error *err);
bool mf_path_exists(const char *path);
bool mf_is_dir(const char *path);
/* dst = dir + "/" + name; fails (returns false) when it would not fit. */
bool mf_path_join(char *dst, size_t cap, const char *dir, const char *name);

/* ---- memory ------------------------------------------------------------ */

/* What this process may still take: ram is the least of MemAvailable and its
 * cgroup's memory.max less what the cgroup holds (beyond reclaimable file
 * cache); vm is RLIMIT_AS less the address space in use (UINT64_MAX: none). */
typedef struct mf_mem_limits {
    uint64_t ram;
    const char *ram_source;   /* "MemAvailable", "the cgroup's memory.max" */
    uint64_t vm;
} mf_mem_limits;

void mf_mem_read_limits(mf_mem_limits *m);
/* MF_ENOMEM with one line naming both figures when need_ram or need_vm is
 * more than there is: "WHAT needs 14.20 GiB of memory, but 8.00 GiB is
 * available (MemAvailable)". */
int mf_mem_check(uint64_t need_ram, uint64_t need_vm, const char *what, mf_error *err);

/* ---- digests (XXH3-128, lower-case hex, 32 chars) --------------------- */

typedef struct mf_digest_state mf_digest_state;
mf_digest_state *mf_digest_new(void);
void mf_digest_update(mf_digest_state *s, const void *data, size_t len);
void mf_digest_final(mf_digest_state *s, char hex[33]);   /* also frees s */
void mf_digest_buffer(const void *data, size_t len, char hex[33]);
int mf_digest_file(const char *path, char hex[33], mf_error *err);

/* ---- logging and progress --------------------------------------------- */

void mf_log_set_quiet(bool quiet);
void mf_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* stderr, one line */

/* A progress bar on stderr, drawn only when stderr is a terminal. */
typedef struct mf_progress {
    bool enabled;
    double start;
    double last_draw;
    uint64_t total;
    const char *label;
} mf_progress;

void mf_progress_begin(mf_progress *p, const char *label, uint64_t total);
void mf_progress_update(mf_progress *p, uint64_t done, const char *detail);
void mf_progress_end(mf_progress *p);

double mf_now(void);   /* monotonic seconds */

/* ---- run-time modules ---------------------------------------------------
 * Parts that bring large libraries (CUDA, ROCm, cairo, libcurl) are modules loaded when a command needs them, so
 * no other command pays for loading them. Looked for in $MOEFLIP_MODULE_DIR, the program's directory, its parent,
 * and the build directory. A module finds the core's functions in the program, which exports its mf_* symbols
 * only (cmake/exports.list).
 *
 * A module shares structures with the program (mf_error, mf_model, mf_seq_result, mf_figure, mf_push_opts, the
 * backends' entry points): one built from other headers would run on mismatched layouts. Every module therefore
 * says which version of that interface it was built for (MF_MODULE_ABI_DEFINE), and one that says another, or
 * nothing, is refused. Raise MF_MODULE_ABI with any change to what a module and the program share. */

#define MF_MODULE_ABI 3   /* 2: the GPU backends count their devices (gpu_count); 3: sessions and routing replay */
/* In one file of every module: the version it was built for, as the symbol mf_module_abi. */
#define MF_MODULE_ABI_DEFINE                                                                                        \
    extern __attribute__((visibility("default"))) const unsigned mf_module_abi;                                  \
    const unsigned mf_module_abi = MF_MODULE_ABI

/* A function a module must have, and where its address goes. */
typedef struct mf_module_fn {
    const char *name;
    void **slot;
} mf_module_fn;

/* Opens module `file` ("libmoeflip_cuda.so"), checks its interface version and resolves every function of fns.
 * MF_EIO naming the file when it is not found, cannot be loaded or lacks a function; MF_EMISMATCH naming the file
 * and both versions when it was built for another interface (or before modules said theirs). */
int mf_module_load(void **module, const char *file, const mf_module_fn *fns, size_t n_fns, mf_error *err);
void mf_module_close(void *module);

/* ---- deterministic random numbers (splitmix64 seeded xoshiro256**) ---- */

typedef struct mf_rng { uint64_t s[4]; } mf_rng;
void mf_rng_seed(mf_rng *r, uint64_t seed);
uint64_t mf_rng_next(mf_rng *r);
double mf_rng_uniform(mf_rng *r);            /* [0, 1) with 53 random bits */
double mf_rng_normal(mf_rng *r);             /* Box-Muller, standard normal */

/* ---- small helpers ----------------------------------------------------- */

void *mf_xmalloc(size_t n);          /* on out of memory: one line on stderr and exit 1 (commands check memory first) */
void *mf_xcalloc(size_t n, size_t size);
void *mf_xrealloc(void *p, size_t n);
char *mf_xstrdup(const char *s);

/* A growable byte string: s holds n bytes and a NUL after them (s is NULL while nothing was put), cap the room.
 * Zero-initialised it is empty; growing it doubles the room, so n puts cost O(n) copies. */
typedef struct mf_buf {
    char *s;
    size_t n, cap;
} mf_buf;
/* Room for `more` bytes beyond n and the NUL. */
void mf_buf_reserve(mf_buf *b, size_t more);
void mf_buf_put(mf_buf *b, const void *data, size_t n);
void mf_buf_puts(mf_buf *b, const char *str);
void mf_buf_putc(mf_buf *b, char c);
void mf_buf_printf(mf_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The string, NUL-terminated (never NULL), handed over: the buffer is left empty. */
char *mf_buf_take(mf_buf *b, size_t *len);
void mf_buf_free(mf_buf *b);

#endif
