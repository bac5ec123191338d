/* moeflip runtime: the forward pass of a loaded model over one sequence,
 * recording what the router did at every MoE layer.
 *
 * The CPU executor follows transformers v5 (5.17) cast point by cast point
 * (docs/precision.md, "Cast points"): in a bf16
 * run every op's result is rounded to bf16, elementwise math in between runs
 * in fp32 ("opmath"), matrix products accumulate in fp32; the MoE combine is
 * grouped_mm's (slot products summed in fp32, one rounding). In an fp64 run
 * every operation is in double, from the exact stored weights. */
#ifndef MF_RUNTIME_H
#define MF_RUNTIME_H

#include "mf_core.h"
#include "mf_numerics.h"
#include "mf_models.h"

/* Routing replay: the experts another run of the same model dispatched, dispatched again instead of the
 * router's own choice (the router still runs; its logits are recorded as computed). Position p of a sequence
 * replays while the sequence's tokens 0 .. p are the source's (tokens[0 .. p]): a sequence that parts from the
 * source (a generated token of its own) routes itself from that position on, where the source's choices
 * belong to other inputs. */
typedef struct mf_replay {
    int len;                  /* positions the source recorded */
    const int32_t *tokens;    /* [len] the source's tokens */
    const uint16_t *ids;      /* [n_moe, len, k] the experts it dispatched, rank order */
    const double *weights;    /* [n_moe, len, k] the weights it applied, or NULL: this run's router gives the
                               * weights of the replayed experts (mf_route_weights over its own scores) */
    const bool *layers;       /* [n_moe] which MoE layers replay (NULL: every one) */
} mf_replay;

typedef struct mf_run_opts {
    mf_precision prec;
    int threads;
    bool record_router_in;       /* keep the router's input [L, T, H] */
    const mf_numerics *numerics; /* how matrix products run (NULL: native) */
    const mf_replay *replay;     /* NULL: the router's own choices; read at every step of a session */
} mf_run_opts;

/* What a forward pass produces, mf_seq_result, is declared in mf_models.h: the run writer (rundir/) records
 * it without seeing the executor. */

/* Loads a model for a run of the given precision (weights rounded to the
 * policy's weight dtype, packed for its compute type). */
int mf_runtime_load(mf_model **out, const char *dir, const mf_precision *prec, mf_error *err);

/* Upper bounds of what one T-token sequence allocates at its peak, beside
 * the weights: on the CPU (activations, per-thread scratch, the result and
 * the run writer's copy), and on the host of a GPU run (pinned buffers, the
 * result). For the memory check before a model is loaded. */
uint64_t mf_forward_cpu_bytes(const mf_config *c, int T, int threads, bool router_in);
uint64_t mf_forward_gpu_host_bytes(const mf_config *c, int T);

int mf_forward_cpu(const mf_model *m, const mf_run_opts *o, const int32_t *tokens, int T, mf_seq_result *r,
                   mf_error *err);
/* A sequence run token by token on the CPU, with a key-value cache: the
 * prompt first (all its tokens, from position 0), then one token at a time
 * against the cache (the decode path). On the CPU each position's results
 * are the same bits as in one pass over the whole sequence (the products'
 * chains do not depend on how many rows share them); r gets the new
 * positions only. */
typedef struct mf_cpu_session mf_cpu_session;
int mf_cpu_session_open(mf_cpu_session **out, const mf_model *m, const mf_run_opts *o, int max_T, mf_error *err);
int mf_cpu_session_forward(mf_cpu_session *s, const int32_t *tokens, int n, mf_seq_result *r, mf_error *err);
/* Positions run so far. */
int mf_cpu_session_length(const mf_cpu_session *s);
/* Forgets the positions from pos on (1 <= pos <= the length): the next token is position pos again, its
 * results the same bits as if the forgotten ones had never run (several continuations of one prompt). */
int mf_cpu_session_rewind(mf_cpu_session *s, int pos, mf_error *err);
void mf_cpu_session_close(mf_cpu_session *s);

/* Digests of n sequences' outputs, each over all sequences in order:
 * logits, router, topk_ids, topk_w, shared_gate (MF_SEQ_DIGEST_NAMES). Two
 * runs agree bit for bit exactly when these agree (the GPU record of
 * tests/fixtures/gpu holds them). */
#define MF_SEQ_DIGESTS 5
extern const char *const MF_SEQ_DIGEST_NAMES[MF_SEQ_DIGESTS];
void mf_seq_results_digest(const mf_seq_result *r, size_t n, char out[MF_SEQ_DIGESTS][33]);

/* ---- GPUs (runtime/gpu: one source, built for CUDA and for HIP) ----------
 *
 * The same forward pass on a GPU, step for step, activations in double and
 * the CPU's cast points, so that `fixed` and `emu:ARCH` runs equal the
 * CPU's runs of the same instruction model bit for bit. Matrix products:
 * native = cuBLAS (HIP: our MFMA kernel), experts grouped per expert in one
 * launch; fixed = our mma.sync k16 chain; emu:ARCH = numerics/'s models in
 * exact arithmetic on the GPU. */
typedef struct mf_gpu mf_gpu;

/* Whether this build has the backend ("cuda" or "hip"). */
bool mf_gpu_built(const char *backend);
/* device: "cuda", "cuda:N", "hip" or "hip:N". Checks that the model and a
 * max_tokens-token sequence (and, cache_tokens > 0, a session's key-value
 * cache of that many positions) fit the device's free memory, uploads the
 * model's weights once (straight from its files; the weights digest is made
 * on the way when the model was loaded with MF_LOAD_DEFER_DIGEST), and, when
 * max_tokens > 0, allocates the scratch and runs one warm-up forward, so
 * that no sequence pays for set-up. The model must be loaded with
 * MF_LOAD_NO_CONVERT (its views in the checkpoint's files). */
int mf_gpu_open(mf_gpu **out, const char *device, mf_model *m, const mf_precision *prec, const mf_numerics *num,
                int max_tokens, int cache_tokens, mf_error *err);
/* What a GPU forward hands back. The logits always reach the host, in the
 * head's dtype (bf16, fp16, or fp32 for wider heads: exact either way), in a
 * buffer of the GPU object (mf_gpu_host_logits, valid until the next
 * forward), as Hugging Face hands them over; with MF_GPU_LOGITS also as
 * doubles in r->logits. */
enum { MF_GPU_ROUTING = 1u, MF_GPU_LOGITS = 2u, MF_GPU_ALL = 3u };
/* One sequence; routing (ids, weights, router logits, shared gates) is copied
 * back with MF_GPU_ROUTING. */
int mf_gpu_forward(mf_gpu *g, const int32_t *tokens, int T, unsigned capture, mf_seq_result *r, mf_error *err);
/* Sessions (generation), when the GPU was opened with cache_tokens > 0: a sequence run a prompt first (from
 * position 0), then one token at a time, every layer's keys and values kept on the device. Each step's
 * products are its own (a one-row product on cuBLAS is another kernel than the prompt's): under `fixed` and
 * `emu:` numerics a position's results are the bits of one pass over the whole sequence, under native they
 * need not be (the decode path's own routing). r gets the new positions only. */
int mf_gpu_session_forward(mf_gpu *g, const int32_t *tokens, int n, unsigned capture, mf_seq_result *r, mf_error *err);
/* Forgets the positions from pos on (0: a new sequence). */
int mf_gpu_session_rewind(mf_gpu *g, int pos, mf_error *err);
/* Routing replay for the sequences that follow (NULL: the router's own choices), as on the CPU (mf_replay);
 * read at every forward and session step until set again. */
void mf_gpu_set_replay(mf_gpu *g, const mf_replay *rp);
/* The last forward's logits [T, V] in host memory, of *dtype (MF_BF16, MF_F16 or MF_F32). */
const void *mf_gpu_host_logits(const mf_gpu *g, mf_dtype *dtype);
/* "NVIDIA H200 (sm_90)" */
const char *mf_gpu_describe(const mf_gpu *g);
void mf_gpu_close(mf_gpu *g);
/* One matrix product on the GPU, as the forward pass issues a weight's (moeflip_gpu_check's product checks):
 * c[M, N] = round_out(a[M, K] . w_e^T) with a [M][K] holding values of `in` (BF16, F16 or F32), w[experts]
 * matrices [N, K] (F32, BF16, F16, or block-scaled), on the engine the forward pass takes for such operands under
 * num; offsets NULL: dense, with w[0]; else [experts + 1], rows offsets[e] .. offsets[e + 1] - 1 with w[e] (a
 * grouped expert product). */
int mf_gpu_matmul(const char *device, const mf_numerics *num, mf_dtype in, mf_dtype out, const mf_mat *w, int experts,
                  const double *a, int M, const int *offsets, double *c, mf_error *err);
/* Whether a device string is well formed: cpu, cuda, cuda:N, hip or hip:N
 * (N from 0 to 1023); MF_EINVAL naming it otherwise. Whether this build has
 * the backend is mf_gpu_open's to say. */
int mf_device_check(const char *device, mf_error *err);
/* Whether a device string names a GPU (anything but "cpu"). */
bool mf_device_is_gpu(const char *device);
/* How many GPUs the backend of device ("cuda", "hip:1", ...) sees, loading its module; MF_EIO naming why when
 * there are none. */
int mf_gpu_count(const char *device, int *count, mf_error *err);
/* The device of one rank of a job (trace under mpirun or srun): "cuda" or "hip" without an index becomes the
 * rank-th of the node's count GPUs, round robin ("cuda:<rank % count>"; rank is the node-local rank); "cpu" and
 * a GPU named with its index are taken as given. out gets the device string (cap bytes). */
int mf_device_for_rank(const char *device, int rank, int count, char *out, size_t cap, mf_error *err);

/* RoPE tables [T, rot_dim] (cos, sin), as the policy computes them (exposed for tests). */
void mf_rope_tables(const mf_config *cfg, const mf_precision *prec, int T, double *cos_t, double *sin_t);

#endif
